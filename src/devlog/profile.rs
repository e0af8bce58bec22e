//! What a profiler output becomes, whichever form it came in: the memory events with
//! their categories, the spans that enclose them, and the clock the times were read on
//! ([`ProfileTrace`]). [`super::kineto`] reads Kineto / Chrome traces into it and
//! [`super::memory_timeline`] the rows of `export_memory_timeline`.

use serde::Serialize;

/// Which kind of profiler output a file was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileKind {
    /// A Kineto / Chrome trace (`traceEvents`, or Chrome's bare list of events).
    KinetoTrace,
    /// `export_memory_timeline(*.raw.json.gz)`: `[timestamp_ns, action, numbytes, category]`.
    MemoryTimelineRaw,
    /// `export_memory_timeline(*.json)`: `[times, sizes]`, bytes per category over time.
    MemoryTimelineCategories,
}

/// What the trace's times are counted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceClock {
    /// Absolute Unix time in the file (Kineto before 2024, memory-timeline rows).
    Unix,
    /// Relative to `baseTimeNanoseconds`, which was added (Kineto from May 2024).
    RelativeToBase,
    /// Small relative times without a base (Kineto of April-May 2024): not Unix time, so
    /// the trace cannot be placed beside other recordings by its clock.
    Unknown,
}

/// What a memory-timeline row's bytes are, as `torch.profiler._memory_profiler` sorts them
/// (the plot's colour order, which is the index written in raw rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    OptimizerState,
    Input,
    Temporary,
    Activation,
    Gradient,
    AutogradDetail,
    Unknown,
}

impl Category {
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::OptimizerState,
        Category::Input,
        Category::Temporary,
        Category::Activation,
        Category::Gradient,
        Category::AutogradDetail,
        Category::Unknown,
    ];

    /// The category of a raw row's index (0 to 7).
    pub fn from_index(i: i64) -> Option<Category> {
        usize::try_from(i)
            .ok()
            .and_then(|i| Category::ALL.get(i))
            .copied()
    }

    /// The name PyTorch's enum gives it, lower case (`activation`, `optimizer_state`).
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::OptimizerState => "optimizer_state",
            Category::Input => "input",
            Category::Temporary => "temporary",
            Category::Activation => "activation",
            Category::Gradient => "gradient",
            Category::AutogradDetail => "autograd_detail",
            Category::Unknown => "unknown",
        }
    }
}

/// One allocator event: a `[memory]` instant event, or one memory-timeline change.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryEvent {
    /// Unix nanoseconds (the file's own clock when [`TraceClock::Unknown`]).
    pub time_ns: i64,
    /// `c10::DeviceType` as int: 0 CPU, 1 CUDA; -1 for memory-timeline rows (not recorded).
    pub device_type: i64,
    /// Device index, -1 for CPU (and for memory-timeline rows).
    pub device_id: i64,
    /// +block size on allocation, -block size on free.
    pub bytes: i64,
    /// Allocator-wide allocated bytes of the device after the event (absent in 2021 traces).
    pub total_allocated: Option<i64>,
    /// Allocator-wide reserved bytes of the device after the event (absent in 2021 traces).
    pub total_reserved: Option<i64>,
    /// The block's address (absent in 2021 traces and memory-timeline rows).
    pub addr: Option<u64>,
    /// Index into [`ProfileTrace::threads`]; None for memory-timeline rows.
    pub thread: Option<u32>,
    /// Memory-timeline rows only.
    pub category: Option<Category>,
}

/// What kind of span encloses allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// An operator (`cpu_op`; `Operator` in 2021 traces), such as `aten::empty`.
    Operator,
    /// A Python function or module (`python_function`, traces taken `with_stack=True`).
    PythonFunction,
    /// A `record_function` range (`user_annotation`), such as `ProfilerStep#3`.
    Annotation,
}

/// A complete (`X`) event on a CPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Span {
    pub thread: u32,
    /// Unix nanoseconds, as [`MemoryEvent::time_ns`].
    pub start_ns: i64,
    pub end_ns: i64,
    /// Index into [`ProfileTrace::names`].
    pub name: u32,
    pub kind: SpanKind,
    /// The operator's `Call stack` argument (2021 traces taken `with_stack=True`): Python
    /// frames `file(line): function` joined by `;`, innermost first; index into
    /// [`ProfileTrace::names`].
    pub call_stack: Option<u32>,
}

/// The memory events of one profiler output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileTrace {
    pub kind: ProfileKind,
    pub clock: TraceClock,
    /// The top-level `baseTimeNanoseconds` when present.
    pub base_time_ns: Option<i64>,
    /// Sorted by time, file order among equal times.
    pub memory: Vec<MemoryEvent>,
    /// Operator, Python-function and annotation spans, sorted by (thread, start, longest
    /// first).
    pub spans: Vec<Span>,
    /// Distinct span names, in order of first appearance.
    pub names: Vec<String>,
    /// Distinct (pid, tid) pairs, as text, in order of first appearance.
    pub threads: Vec<String>,
    /// `[OutOfMemory]` events.
    pub out_of_memory_events: u64,
    /// Elements of the list of events that are not events (nested lists, numbers,
    /// strings): skipped, and said in the converted snapshot's warnings.
    #[serde(skip_serializing_if = "crate::units::is_zero")]
    pub skipped_elements: u64,
    /// Top-level events (or rows) read.
    pub events_read: u64,
}

pub(crate) const TRACE_KIND: &str =
    "a Kineto/Chrome trace JSON (torch.profiler with profile_memory=True)";
