//! One way in for a caller that holds a whole pickle in memory: "read these bytes, with
//! N workers, giving pages back as you go", without knowing how.
//!
//! [`Reader`] runs both passes over the bytes: the reference scan in stretches on the
//! rayon pool ([`scan_slice_chunks`]), then the reader ([`parse_slice_releasing`]). When
//! it is told to release, it calls the caller's function for the bytes behind each pass
//! (a mapped file's pages go back to the page cache), and when it is given workers and
//! the bytes shared, it offers the builder the stretches the scan found
//! ([`Builder::read_ahead`]) so that the builder can decode them ahead on its own
//! threads, telling the same function which bytes those read. What a builder does with
//! the stretches is its own affair; this module starts no thread. Streams (gzip content)
//! take [`super::scan_references`] and [`super::parse_with`] instead: they are read twice
//! from the start and cannot be shared.

use super::memo::{MemoReferences, Stretches, scan_slice_chunks};
use super::ops::Release;
use super::vm::{Builder, ParseInfo, parse_slice_releasing};
use super::{Error, Value};
use std::sync::Arc;

/// The bytes being read, held for threads that read them too.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;
/// Told that the bytes `[start, end)` are read (by a pass or by a worker), so that their
/// pages may go back; called from any thread.
pub type SharedRelease = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Inputs smaller than this are read without workers: starting them costs more than
/// they save.
pub const READ_AHEAD_MIN_BYTES: usize = 16 << 20;

/// Stretches the reference scan cuts the bytes into, per thread of the rayon pool (more
/// than one each, so that stretches of unequal cost even out).
const STRETCHES_PER_THREAD: usize = 16;

/// What a builder is offered to decode stretches of the bytes ahead of the reader
/// ([`Builder::read_ahead`]).
pub struct ReadAhead {
    /// The bytes the reader reads.
    pub data: SharedBytes,
    /// To be told the bytes each worker has read.
    pub release: Option<SharedRelease>,
    /// Where a worker may start, with the memo count there.
    pub stretches: Stretches,
    /// The memo indices read back, from the first pass.
    pub refs: MemoReferences,
    /// Threads the builder may start besides the reader's.
    pub workers: usize,
}

/// Both passes over a pickle held in memory (see the module's notes).
pub struct Reader<'a> {
    bytes: &'a [u8],
    shared: Option<SharedBytes>,
    workers: usize,
    release: Option<SharedRelease>,
}

impl<'a> Reader<'a> {
    /// Reads `bytes` on this thread alone, releasing nothing.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader {
            bytes,
            shared: None,
            workers: 0,
            release: None,
        }
    }

    /// Lets the builder decode ahead on `workers` threads besides this one, reading
    /// `shared`, which must hold the same bytes (inputs under [`READ_AHEAD_MIN_BYTES`]
    /// are read without).
    pub fn workers(mut self, workers: usize, shared: SharedBytes) -> Self {
        self.workers = workers;
        self.shared = Some(shared);
        self
    }

    /// Calls `release` for the bytes behind each pass and each worker.
    pub fn releasing(mut self, release: Option<SharedRelease>) -> Self {
        self.release = release;
        self
    }

    /// Reads the pickle into `builder`.
    pub fn parse<B: Builder>(self, builder: &mut B) -> Result<(Value, ParseInfo), Error> {
        let Reader {
            bytes,
            shared,
            workers,
            release,
        } = self;
        let pass_release: Option<Release> = release.as_deref().map(|f| f as Release);
        let stretch_count = rayon::current_num_threads() * STRETCHES_PER_THREAD;
        let (refs, stretches) = scan_slice_chunks(bytes, stretch_count, pass_release)?;
        if let (Some(stretches), Some(data)) = (stretches, shared)
            && workers > 0
            && bytes.len() >= READ_AHEAD_MIN_BYTES
        {
            builder.read_ahead(ReadAhead {
                data,
                release: release.clone(),
                stretches,
                refs: refs.clone(),
                workers,
            });
        }
        parse_slice_releasing(bytes, refs, builder, pass_release)
    }
}
