//! OOM messages in logs: real messages from GitHub issues (message text only, each naming
//! its source), both forms, prefixes, wrapping, several messages, and property tests that
//! the reader never panics.

use proptest::prelude::*;
use vramlens::devlog::oom_log::{
    OomForm, OomMessage, parse_oom_messages, parse_oom_messages_from, parse_size,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * 1024 * 1024;

/// `text` with whitespace runs made one space, as [`OomMessage::text`] is.
fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The only message in `log`.
fn only(log: &str) -> OomMessage {
    let found = parse_oom_messages(log);
    assert_eq!(
        found.len(),
        1,
        "expected one message in {log:?}, found {found:#?}"
    );
    found.into_iter().next().unwrap()
}

// ---------------------------------------------------------------- real messages (data)

/// Old form, 1.4 to 2.0 wording. From kchengiva/Shift-GCN#34.
const OLD_RESERVED: &str = "RuntimeError: CUDA out of memory. Tried to allocate 236.00 MiB (GPU 0; 15.78 GiB total capacity; 14.25 GiB already allocated; 183.50 MiB free; 14.34 GiB reserved in total by PyTorch)";

/// Old form, 1.0 to 1.3 wording with `cached`. From pytorch/pytorch#16417 (title).
const OLD_CACHED: &str = "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)";

/// Old form, `1024.00 KiB` and `KiB` values. From shllln/GenerativeGraph#5.
const OLD_KIB: &str = "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; 11.17 GiB total capacity; 10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)";

/// Old form with `0 bytes free` and the 1.10+ hint, then the next log line.
/// From CompVis/stable-diffusion#702.
const OLD_HINT: &str = "OutOfMemoryError: CUDA out of memory. Tried to allocate 192.00 MiB (GPU 0; 4.00 GiB total capacity; 3.08 GiB already allocated; 0 bytes free; 3.47 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation. See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\nTime taken: 2m 24.41sTorch active/reserved: 3457/3576 MiB, Sys VRAM: 4096/4096 MiB (100.0%)";

/// Old form cut off before the `)`. From singhsourabh/Resume-NER#4.
const OLD_TRUNCATED: &str = "RuntimeError: CUDA out of memory. Tried to allocate 92.00 MiB (GPU 0; 1.96 GiB total capacity; 1.46 GiB already allocated; 16.38 MiB free; 1.51 GiB reserved in total by PyTorch\n\nI tried every possible way like changing the batch size from 8 to 4 and clearing the cache of CUDA Memory.";

/// New form, 2.2+ wording with the expandable-segments hint. From pytorch/pytorch#16417
/// (a 2024 comment).
const NEW_CUDA: &str = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// New form, 2.1 wording (`capacty`, `max_split_size_mb` hint). From kerrj/lerf#73.
const NEW_CAPACTY: &str = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacty of 23.65 GiB of which 1.66 GiB is free. Including non-PyTorch memory, this process has 20.81 GiB memory in use. Of the allocated memory 12.09 GiB is allocated by PyTorch, and 4.84 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";

/// New form wrapped over lines, with another process. From the description of
/// pytorch/pytorch#99699 (the pull request that introduced the wording).
const NEW_WRAPPED: &str =
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 138.00 MiB.
GPU 0 has a total capacty of 15.90 GiB of which 8.44 MiB is free.
Process 1246069 has 577.00 MiB memory in use. Including non-PyTorch memory,
this process has 15.32 GiB memory in use. Of the allocated memory
14.12 GiB is allocated by PyTorch, and 410.41 MiB is reserved
by PyTorch but unallocated. If reserved but unallocated memory is large
try setting max_split_size_mb to avoid fragmentation.  See documentation
 for Memory Management and PYTORCH_CUDA_ALLOC_CONF";

/// ROCm. From ROCm/TheRock#1054.
const NEW_HIP: &str = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 15.24 GiB of which 15.09 GiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// ROCm through a logger with its own prefix. From huggingface/autotrain-advanced#737.
const NEW_HIP_LOGGED: &str = "ERROR    | 2024-08-21 22:56:04 | autotrain.trainers.common:wrapper:121 - HIP out of memory. Tried to allocate 124.00 MiB. GPU 0 has a total capacity of 19.94 GiB of which 554.47 MiB is free. Of the allocated memory 15.87 GiB is allocated by PyTorch, and 165.29 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// ROCm on device 7 with hundreds of GiB. From pytorch/pytorch#175431.
const NEW_HIP_GPU7: &str = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 7 has a total capacity of 287.98 GiB of which 203.49 GiB is free. Of the allocated memory 68.63 GiB is allocated by PyTorch, and 14.93 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

const REAL: [&str; 12] = [
    OLD_RESERVED,
    OLD_CACHED,
    OLD_KIB,
    OLD_HINT,
    OLD_TRUNCATED,
    NEW_CUDA,
    NEW_CAPACTY,
    NEW_WRAPPED,
    NEW_HIP,
    NEW_HIP_LOGGED,
    NEW_HIP_GPU7,
    MULTI_PROCESS,
];

// ---------------------------------------------------------------- old form

#[test]
fn old_form_reserved_in_total() {
    let m = only(OLD_RESERVED);
    assert_eq!(m.line, 1);
    assert_eq!(m.end_line, 1);
    assert_eq!(m.form, OomForm::Old);
    assert_eq!(m.backend, "CUDA");
    assert_eq!(m.exception.as_deref(), Some("RuntimeError"));
    // 236.00 MiB = 236 × 1048576 = 247463936
    assert_eq!(m.requested_bytes, Some(247_463_936));
    assert_eq!(m.gpu, Some(0));
    // 15.78 GiB = 15.78 × 1073741824 = 16943645982.72 → 16943645983
    assert_eq!(m.total_capacity_bytes, Some(16_943_645_983));
    // 14.25 GiB = 14.25 × 1073741824 = 15300820992
    assert_eq!(m.allocated_by_pytorch_bytes, Some(15_300_820_992));
    // 183.50 MiB = 183.5 × 1048576 = 192413696
    assert_eq!(m.free_bytes, Some(192_413_696));
    // 14.34 GiB = 14.34 × 1073741824 = 15397457756.16 → 15397457756
    assert_eq!(m.reserved_by_pytorch_bytes, Some(15_397_457_756));
    // derived: 15397457756 − 15300820992 = 96636764
    assert_eq!(m.reserved_unallocated_bytes, Some(96_636_764));
    assert_eq!(m.this_process_bytes, None);
    assert_eq!(m.allowed_bytes, None);
    assert!(m.processes.is_empty());
    assert_eq!(m.text, collapse(OLD_RESERVED));
}

#[test]
fn old_form_cached_is_reserved_minus_allocated() {
    let m = only(OLD_CACHED);
    assert_eq!(m.form, OomForm::Old);
    // 12.50 MiB = 12.5 × 1048576 = 13107200
    assert_eq!(m.requested_bytes, Some(13_107_200));
    // 10.92 GiB = 10.92 × 1073741824 = 11725260718.08 → 11725260718
    assert_eq!(m.total_capacity_bytes, Some(11_725_260_718));
    // 8.57 MiB = 8.57 × 1048576 = 8986296.32 → 8986296
    assert_eq!(m.allocated_by_pytorch_bytes, Some(8_986_296));
    // 9.28 GiB = 9.28 × 1073741824 = 9964324126.72 → 9964324127
    assert_eq!(m.free_bytes, Some(9_964_324_127));
    // 4.68 MiB = 4.68 × 1048576 = 4907335.68 → 4907336 ("cached": held but not used)
    assert_eq!(m.reserved_unallocated_bytes, Some(4_907_336));
    // reserved = allocated + cached = 8986296 + 4907336 = 13893632
    assert_eq!(m.reserved_by_pytorch_bytes, Some(13_893_632));

    let k = only(OLD_KIB);
    // 1024.00 KiB = 1048576; 576.00 KiB = 589824; 30.96 MiB = 32463912.96 → 32463913
    assert_eq!(k.requested_bytes, Some(1024 * KIB));
    assert_eq!(k.free_bytes, Some(576 * KIB));
    assert_eq!(k.reserved_unallocated_bytes, Some(32_463_913));
}

#[test]
fn old_form_hint_ends_the_message() {
    let found = parse_oom_messages(OLD_HINT);
    assert_eq!(found.len(), 1);
    let m = &found[0];
    assert_eq!(m.exception.as_deref(), Some("OutOfMemoryError"));
    // 192.00 MiB = 201326592; 4.00 GiB = 4294967296; 0 bytes free
    assert_eq!(m.requested_bytes, Some(192 * MIB));
    assert_eq!(m.total_capacity_bytes, Some(4 * GIB));
    assert_eq!(m.free_bytes, Some(0));
    // 3.08 GiB = 3307124817.92 → 3307124818; 3.47 GiB = 3725884129.28 → 3725884129
    assert_eq!(m.allocated_by_pytorch_bytes, Some(3_307_124_818));
    assert_eq!(m.reserved_by_pytorch_bytes, Some(3_725_884_129));
    assert!(
        m.text
            .ends_with("Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    );
    assert_eq!(
        m.end_line, 1,
        "the next log line is not part of the message"
    );
}

#[test]
fn old_form_without_free_and_truncated() {
    // Very old releases printed no `free` item.
    let m = only(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 1; 7.93 GiB total capacity; 6.43 GiB already allocated; 6.62 GiB cached)",
    );
    assert_eq!(m.gpu, Some(1));
    assert_eq!(m.free_bytes, None);
    // 6.43 GiB = 6904159928.32 → 6904159928; 6.62 GiB = 7108170874.88 → 7108170875
    assert_eq!(m.allocated_by_pytorch_bytes, Some(6_904_159_928));
    assert_eq!(m.reserved_unallocated_bytes, Some(7_108_170_875));
    assert_eq!(
        m.reserved_by_pytorch_bytes,
        Some(6_904_159_928 + 7_108_170_875)
    );

    // Cut off before `)`: the last value still counts, and the prose after the blank line
    // is not part of the message.
    let t = only(OLD_TRUNCATED);
    // 1.51 GiB = 1.51 × 1073741824 = 1621350154.24 → 1621350154
    assert_eq!(t.reserved_by_pytorch_bytes, Some(1_621_350_154));
    // 16.38 MiB = 16.38 × 1048576 = 17175674.88 → 17175675
    assert_eq!(t.free_bytes, Some(17_175_675));
    assert_eq!(t.end_line, 1);
    assert!(t.text.ends_with("reserved in total by PyTorch"));
}

#[test]
fn old_form_with_allowed_and_unknown_items() {
    let m = only(
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 2.00 GiB already allocated; 1.00 GiB current active; 10.00 GiB free; 4.00 GiB allowed; 3.00 GiB reserved in total by PyTorch)",
    );
    assert_eq!(m.exception, None);
    assert_eq!(m.allowed_bytes, Some(4 * GIB));
    assert_eq!(m.free_bytes, Some(10 * GIB));
    assert_eq!(m.reserved_by_pytorch_bytes, Some(3 * GIB));
    assert_eq!(m.reserved_unallocated_bytes, Some(GIB));
}

// ---------------------------------------------------------------- new form

#[test]
fn new_form_exact_values() {
    let m = only(NEW_CUDA);
    assert_eq!(m.form, OomForm::New);
    assert_eq!(m.backend, "CUDA");
    assert_eq!(m.exception.as_deref(), Some("torch.cuda.OutOfMemoryError"));
    // 22.00 MiB = 22 × 1048576 = 23068672
    assert_eq!(m.requested_bytes, Some(23_068_672));
    assert_eq!(m.gpu, Some(0));
    // 23.65 GiB = 23.65 × 1073741824 = 25393994137.6 → 25393994138
    assert_eq!(m.total_capacity_bytes, Some(25_393_994_138));
    // 11.06 MiB = 11.06 × 1048576 = 11597250.56 → 11597251
    assert_eq!(m.free_bytes, Some(11_597_251));
    // 23.60 GiB = 23.6 × 1073741824 = 25340307046.4 → 25340307046
    assert_eq!(m.this_process_bytes, Some(25_340_307_046));
    // 22.90 GiB = 22.9 × 1073741824 = 24588687769.6 → 24588687770
    assert_eq!(m.allocated_by_pytorch_bytes, Some(24_588_687_770));
    // 194.87 MiB = 194.87 × 1048576 = 204336005.12 → 204336005
    assert_eq!(m.reserved_unallocated_bytes, Some(204_336_005));
    // reserved = 24588687770 + 204336005 = 24793023775
    assert_eq!(m.reserved_by_pytorch_bytes, Some(24_793_023_775));
    assert!(m.processes.is_empty());
    assert_eq!(m.private_pools_bytes, None);
    assert_eq!(
        m.text,
        collapse(NEW_CUDA),
        "the whole message, hint and link included"
    );
}

#[test]
fn new_form_2_1_spelling() {
    let m = only(NEW_CAPACTY);
    assert_eq!(m.form, OomForm::New);
    // 3.00 GiB = 3221225472; 23.65 GiB → 25393994138 (as above)
    assert_eq!(m.requested_bytes, Some(3 * GIB));
    assert_eq!(m.total_capacity_bytes, Some(25_393_994_138));
    // 1.66 GiB = 1.66 × 1073741824 = 1782411427.84 → 1782411428
    assert_eq!(m.free_bytes, Some(1_782_411_428));
    // 12.09 GiB = 12981538652.16 → 12981538652; 4.84 GiB = 5196910428.16 → 5196910428
    assert_eq!(m.allocated_by_pytorch_bytes, Some(12_981_538_652));
    assert_eq!(m.reserved_unallocated_bytes, Some(5_196_910_428));
    assert!(
        m.text
            .ends_with("Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    );
}

/// The brief's example with several other processes (one whose pid is not a number), as
/// torchrun prints it: every line behind `[rank3]:`, the message wrapped over four lines.
const MULTI_PROCESS: &str = "[rank3]: Traceback (most recent call last):
[rank3]:   File \"train.py\", line 10, in <module>
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 79.15 GiB of which 3.44 MiB is free.
[rank3]: Process 12345 has 1.50 GiB memory in use. Process 23456 has 512.00 MiB memory in use.
[rank3]: Process [unknown] has 2.00 GiB memory in use. Including non-PyTorch memory, this process has 75.14 GiB memory in use.
[rank3]: Of the allocated memory 72.50 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
[rank3]: [W101 12:00:00.000000 ProcessGroupNCCL.cpp:1] destroy_process_group() was not called";

#[test]
fn new_form_several_processes_prefixed_and_wrapped() {
    let m = only(MULTI_PROCESS);
    assert_eq!(m.line, 3);
    assert_eq!(m.end_line, 6);
    assert_eq!(m.form, OomForm::New);
    assert_eq!(m.exception.as_deref(), Some("torch.OutOfMemoryError"));
    // 20.00 MiB = 20 × 1048576 = 20971520
    assert_eq!(m.requested_bytes, Some(20_971_520));
    assert_eq!(m.gpu, Some(3));
    // 79.15 GiB = 79.15 × 1073741824 = 84986665369.6 → 84986665370
    assert_eq!(m.total_capacity_bytes, Some(84_986_665_370));
    // 3.44 MiB = 3.44 × 1048576 = 3607101.44 → 3607101
    assert_eq!(m.free_bytes, Some(3_607_101));
    // 1.50 GiB = 1610612736; 512.00 MiB = 536870912; 2.00 GiB = 2147483648
    assert_eq!(
        m.processes,
        vec![
            (Some(12345), 1_610_612_736),
            (Some(23456), 536_870_912),
            (None, 2_147_483_648)
        ]
    );
    // 75.14 GiB = 75.14 × 1073741824 = 80680960655.36 → 80680960655
    assert_eq!(m.this_process_bytes, Some(80_680_960_655));
    // 72.50 GiB = 77846282240; 1.20 GiB = 1288490188.8 → 1288490189
    assert_eq!(m.allocated_by_pytorch_bytes, Some(77_846_282_240));
    assert_eq!(m.reserved_unallocated_bytes, Some(1_288_490_189));
    assert_eq!(
        m.reserved_by_pytorch_bytes,
        Some(77_846_282_240 + 1_288_490_189)
    );
    assert!(
        m.text
            .starts_with("torch.OutOfMemoryError: CUDA out of memory.")
    );
    assert!(!m.text.contains("[rank3]"), "{}", m.text);
    assert!(m.text.ends_with("#environment-variables)"));
}

#[test]
fn new_form_wrapped_without_prefix() {
    let m = only(NEW_WRAPPED);
    assert_eq!((m.line, m.end_line), (1, 8));
    // 138.00 MiB = 144703488
    assert_eq!(m.requested_bytes, Some(138 * MIB));
    // 15.90 GiB = 17072495001.6 → 17072495002; 8.44 MiB = 8849981.44 → 8849981
    assert_eq!(m.total_capacity_bytes, Some(17_072_495_002));
    assert_eq!(m.free_bytes, Some(8_849_981));
    // 577.00 MiB = 577 × 1048576 = 605028352
    assert_eq!(m.processes, vec![(Some(1_246_069), 605_028_352)]);
    // 15.32 GiB = 16449724743.68 → 16449724744
    assert_eq!(m.this_process_bytes, Some(16_449_724_744));
    // 14.12 GiB = 15161234554.88 → 15161234555 (starts a wrapped line: not a timestamp)
    assert_eq!(m.allocated_by_pytorch_bytes, Some(15_161_234_555));
    // 410.41 MiB = 430346076.16 → 430346076
    assert_eq!(m.reserved_unallocated_bytes, Some(430_346_076));
    assert!(
        m.text
            .ends_with("Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    );
    assert!(!m.text.contains('\n'));
}

#[test]
fn new_form_allowed_and_private_pools() {
    // The wording of current CUDACachingAllocator.cpp with a memory fraction and CUDA Graphs.
    let m = only(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 39.39 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 38.36 GiB memory in use. 30.00 GiB allowed; Of the allocated memory 29.50 GiB is allocated by PyTorch, with 4.00 GiB allocated in private pools (e.g., CUDA Graphs), and 100.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
    );
    assert_eq!(m.gpu, Some(1));
    assert_eq!(m.allowed_bytes, Some(30 * GIB));
    // 29.50 GiB = 31675383808; 4.00 GiB private; 100.00 MiB = 104857600
    assert_eq!(m.allocated_by_pytorch_bytes, Some(31_675_383_808));
    assert_eq!(m.private_pools_bytes, Some(4 * GIB));
    assert_eq!(m.reserved_unallocated_bytes, Some(100 * MIB));
    assert_eq!(
        m.reserved_by_pytorch_bytes,
        Some(31_675_383_808 + 100 * MIB)
    );
    assert!(m.text.ends_with("pytorch-cuda-alloc-conf)"));
}

// ---------------------------------------------------------------- backends

#[test]
fn hip_and_xpu() {
    let m = only(NEW_HIP);
    assert_eq!(m.backend, "HIP");
    assert_eq!(m.form, OomForm::New);
    // 16.00 GiB = 17179869184; 15.24 GiB = 16363825397.76 → 16363825398
    assert_eq!(m.requested_bytes, Some(16 * GIB));
    assert_eq!(m.total_capacity_bytes, Some(16_363_825_398));
    // 15.09 GiB = 16202764124.16 → 16202764124
    assert_eq!(m.free_bytes, Some(16_202_764_124));
    assert_eq!(m.allocated_by_pytorch_bytes, Some(0));
    assert_eq!(m.reserved_by_pytorch_bytes, Some(0));

    let logged = only(NEW_HIP_LOGGED);
    assert_eq!(logged.backend, "HIP");
    assert_eq!(logged.exception, None);
    // 124.00 MiB = 130023424; 554.47 MiB = 581403934.72 → 581403935
    assert_eq!(logged.requested_bytes, Some(124 * MIB));
    assert_eq!(logged.free_bytes, Some(581_403_935));
    // 165.29 MiB = 173319127.04 → 173319127
    assert_eq!(logged.reserved_unallocated_bytes, Some(173_319_127));
    assert!(logged.text.starts_with("HIP out of memory."));

    let seven = only(NEW_HIP_GPU7);
    assert_eq!(seven.gpu, Some(7));
    // 287.98 GiB = 287.98 × 1073741824 = 309216170475.52 → 309216170476
    assert_eq!(seven.total_capacity_bytes, Some(309_216_170_476));

    let xpu = only(
        "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 15.11 GiB of which 512.00 MiB is free. Of the allocated memory 14.00 GiB is allocated by PyTorch, and 300.00 MiB is reserved by PyTorch but unallocated. Please use `empty_cache` to release all unoccupied cached memory.",
    );
    assert_eq!(xpu.backend, "XPU");
    assert_eq!(xpu.free_bytes, Some(512 * MIB));
    assert_eq!(xpu.reserved_unallocated_bytes, Some(300 * MIB));
    assert!(xpu.text.ends_with("unoccupied cached memory."));

    // Pre-2.1 ROCm builds printed the old form with HIP.
    let old_hip = only(
        "RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.98 GiB total capacity; 12.00 GiB already allocated; 1.00 GiB free; 14.00 GiB reserved in total by PyTorch)",
    );
    assert_eq!(
        (old_hip.backend.as_str(), old_hip.form),
        ("HIP", OomForm::Old)
    );
    assert_eq!(old_hip.reserved_unallocated_bytes, Some(2 * GIB));
}

// ---------------------------------------------------------------- logs

#[test]
fn several_messages_with_line_numbers() {
    let log = [
        "epoch 1 step 10 loss 2.31", // 1
        "2024-05-01 10:00:01,100 ERROR RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB", // 2
        "2024-05-01 10:00:01,101 ERROR total capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.75 GiB reserved in total by PyTorch)", // 3
        "retrying with batch size 16",          // 4
        "",                                     // 5
        OLD_RESERVED,                           // 6
        NEW_HIP,                                // 7
        "Traceback (most recent call last):",   // 8
        "  File \"x.py\", line 1, in <module>", // 9
        NEW_WRAPPED,                            // 10-17
        "done",                                 // 18
    ]
    .join("\n");
    let found = parse_oom_messages(&log);
    let places: Vec<(usize, usize, &str, OomForm)> = found
        .iter()
        .map(|m| (m.line, m.end_line, m.backend.as_str(), m.form))
        .collect();
    assert_eq!(
        places,
        vec![
            (2, 3, "CUDA", OomForm::Old),
            (6, 6, "CUDA", OomForm::Old),
            (7, 7, "HIP", OomForm::New),
            (10, 17, "CUDA", OomForm::New),
        ]
    );
    let first = &found[0];
    // 14.56 GiB = 15633680957.44 → 15633680957; 14.75 GiB = 15837691904
    assert_eq!(first.total_capacity_bytes, Some(16_943_645_983));
    assert_eq!(first.allocated_by_pytorch_bytes, Some(15_633_680_957));
    assert_eq!(first.reserved_by_pytorch_bytes, Some(15_837_691_904));
    assert!(!first.text.contains("2024-05-01"), "{}", first.text);
    assert_eq!(found[3], only(NEW_WRAPPED).with_lines(10, 17));
}

/// Shifts a message's line numbers, to compare with one parsed alone.
trait WithLines {
    fn with_lines(self, line: usize, end_line: usize) -> Self;
}

impl WithLines for OomMessage {
    fn with_lines(mut self, line: usize, end_line: usize) -> Self {
        self.line = line;
        self.end_line = end_line;
        self.last_line = line;
        self
    }
}

#[test]
fn two_messages_on_one_line_and_repeated_by_a_logger() {
    let log = format!("{NEW_HIP} {NEW_HIP}\r\n{NEW_HIP_LOGGED}\r\n");
    let found = parse_oom_messages(&log);
    // The same text twice is one message met twice.
    assert_eq!(found.len(), 2);
    assert_eq!((found[0].count, found[0].last_line), (2, 1));
    assert_eq!(found.iter().map(|m| m.line).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(found[1].requested_bytes, Some(124 * MIB));
}

#[test]
fn ray_and_glog_prefixes_on_wrapped_lines() {
    let log = "(TrainWorker pid=4242) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 3.44 MiB is free.
(TrainWorker pid=4242) Including non-PyTorch memory, this process has 79.14 GiB memory in use. Of the allocated memory
(TrainWorker pid=4242) 77.50 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.
(TrainWorker pid=4242) epoch 2 starting";
    let m = only(log);
    assert_eq!((m.line, m.end_line), (1, 3));
    // 77.50 GiB = 77.5 × 1073741824 = 83214991360
    assert_eq!(m.allocated_by_pytorch_bytes, Some(83_214_991_360));
    assert!(m.text.ends_with("but unallocated."));
}

#[test]
fn large_and_hostile_logs_stay_linear() {
    // 5000 messages among noise, then long lines of markers that never complete.
    let mut log = String::new();
    for i in 0..5000 {
        log.push_str(&format!("step {i}\n{NEW_HIP}\n"));
    }
    log.push_str(&"CUDA out of memory. Tried to allocate (".repeat(1 << 15));
    log.push('\n');
    log.push_str(&"HIP out of memory. Tried to allocate 1 MiB (GPU 0;".repeat(1 << 14));
    let found = parse_oom_messages(&log);
    // Repeats are counted on the first of each text.
    let new: Vec<&OomMessage> = found.iter().filter(|m| m.form == OomForm::New).collect();
    assert_eq!(new.len(), 1);
    assert_eq!(
        (new[0].line, new[0].count, new[0].last_line),
        (2, 5000, 10_000)
    );
    assert_eq!(found.len(), 2);
    assert_eq!(found.iter().map(|m| m.count).sum::<u64>(), 5000 + (1 << 14));
}

#[test]
fn logs_without_an_oom() {
    assert!(parse_oom_messages("").is_empty());
    assert!(parse_oom_messages("epoch 1 loss 0.5\nepoch 2 loss 0.4\n").is_empty());
    // The driver's error carries no numbers; a bare mention is not a message either.
    assert!(parse_oom_messages("RuntimeError: CUDA error: out of memory").is_empty());
    assert!(parse_oom_messages("RuntimeError: CUDA out of memory.").is_empty());
    assert!(parse_oom_messages("caught CUDA out of memory, halving the batch").is_empty());
    assert!(parse_oom_messages("MYCUDA out of memory. Tried to allocate 1.00 MiB.").is_empty());
}

#[test]
fn serializes_form_in_snake_case() {
    let m = only(NEW_CUDA);
    let json = serde_json::to_value(&m).unwrap();
    assert_eq!(json["form"], "new");
    assert_eq!(json["requested_bytes"], 23_068_672);
    assert_eq!(serde_json::to_value(OomForm::Old).unwrap(), "old");
    let p = serde_json::to_value(only(MULTI_PROCESS).processes).unwrap();
    assert_eq!(p[2], serde_json::json!([null, 2_147_483_648u64]));
}

// ---------------------------------------------------------------- parse_size

#[test]
fn parse_size_edge_cases() {
    assert_eq!(parse_size("20.00 MiB"), Some(20_971_520));
    assert_eq!(parse_size("3.44 GiB"), Some(3_693_671_875)); // 3693671874.56 → …875
    assert_eq!(parse_size("512 bytes"), Some(512));
    assert_eq!(parse_size("1 byte"), Some(1));
    assert_eq!(parse_size("0 bytes"), Some(0));
    assert_eq!(parse_size("1024 bytes"), Some(1024));
    assert_eq!(parse_size("1.5 KiB"), Some(1536));
    assert_eq!(parse_size("1.20 TiB"), Some(1_319_413_953_331)); // 1319413953331.2
    assert_eq!(parse_size("7 B"), Some(7));
    assert_eq!(parse_size("2 KB"), Some(2048));
    assert_eq!(parse_size("1.00 MB"), Some(MIB));
    assert_eq!(parse_size("1.00 GB"), Some(GIB));
    assert_eq!(parse_size("  4.00 gib\t"), Some(4 * GIB));
    assert_eq!(parse_size("20.00MiB"), Some(20 * MIB));
    // Rounding to the nearest byte: 0.01 KiB = 10.24 → 10; 0.005 KiB = 5.12 → 5;
    // 0.5 bytes rounds half up.
    assert_eq!(parse_size("0.01 KiB"), Some(10));
    assert_eq!(parse_size("0.005 KiB"), Some(5));
    assert_eq!(parse_size("2.5 bytes"), Some(3));
    // Limits: 15.99 EiB fits, 16 EiB is u64::MAX + 1.
    assert_eq!(parse_size("16.00 EiB"), None);
    assert_eq!(parse_size("18446744073709551615 bytes"), Some(u64::MAX));
    assert_eq!(parse_size("18446744073709551616 bytes"), None);
    // Not sizes.
    for bad in [
        "",
        " ",
        "MiB",
        "20",
        "20.00",
        "-1 MiB",
        "+1 MiB",
        ".5 MiB",
        "1e3 MiB",
        "1,024 KiB",
        "20.00 MiB.",
        "20.00 MiBs",
        "20 miles",
        "20 KiB extra",
        "١٢ MiB",
        "20 µB",
    ] {
        assert_eq!(parse_size(bad), None, "{bad:?}");
    }
}

// ---------------------------------------------------------------- properties

/// `format_size` of c10/cuda/CUDACachingAllocator.cpp: bytes up to 1 KiB, then KiB, MiB
/// and GiB with two decimals.
fn pytorch_format_size(size: u64) -> (String, u64) {
    let f = size as f64;
    if size <= 1024 {
        (format!("{size} bytes"), 1)
    } else if size <= 1 << 20 {
        (format!("{:.2} KiB", f / 1024.0), KIB)
    } else if size <= 1 << 30 {
        (format!("{:.2} MiB", f / 1048576.0), MIB)
    } else {
        (format!("{:.2} GiB", f / 1073741824.0), GIB)
    }
}

/// Fragments the grammar knows, to build near-messages at random.
const FRAGMENTS: [&str; 32] = [
    "CUDA out of memory.",
    "HIP out of memory",
    " Tried to allocate ",
    "20.00 MiB",
    "0 bytes",
    "1.5",
    " KiB",
    "(",
    ")",
    "; ",
    ".",
    "GPU ",
    "-3",
    " has a total capacity of ",
    " of which ",
    " is free. ",
    "Process ",
    " has ",
    " memory in use. ",
    "Including non-PyTorch memory, this process has ",
    "Of the allocated memory ",
    " is allocated by PyTorch, ",
    "with ",
    " allocated in private pools (e.g., CUDA Graphs), ",
    "and ",
    " is reserved by PyTorch but unallocated.",
    " If reserved",
    " Memory Management ",
    "\n",
    "[rank1]: ",
    "é\u{200b}\r",
    " allowed; ",
];

/// An edit applied to a real message.
#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, String),
    Delete(usize, usize),
    Truncate(usize),
    Newline(usize),
}

fn edit_strategy() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), "\\PC{0,6}").prop_map(|(at, s)| Edit::Insert(at, s)),
        (any::<usize>(), 0usize..20).prop_map(|(at, n)| Edit::Delete(at, n)),
        any::<usize>().prop_map(Edit::Truncate),
        any::<usize>().prop_map(Edit::Newline),
    ]
}

/// Applies `edit` at character positions, so any result is valid UTF-8.
fn apply(text: &str, edit: &Edit) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let len = chars.len();
    match edit {
        Edit::Insert(at, s) => {
            let at = at % (len + 1);
            chars.splice(at..at, s.chars());
        }
        Edit::Delete(at, n) => {
            let at = at % (len + 1);
            let end = (at + n).min(len);
            chars.drain(at..end);
        }
        Edit::Truncate(at) => chars.truncate(at % (len + 1)),
        Edit::Newline(at) => {
            let at = at % (len + 1);
            chars.insert(at, '\n');
        }
    }
    chars.into_iter().collect()
}

/// What must hold for any log.
fn check_invariants(log: &str) {
    let found = parse_oom_messages(log);
    let line_count = log.lines().count();
    let mut last = (0, 0);
    for m in &found {
        assert!(m.line >= 1 && m.line <= m.end_line && m.end_line <= line_count);
        assert!(m.line >= last.0, "messages out of order");
        assert!(["CUDA", "HIP", "XPU"].contains(&m.backend.as_str()));
        assert!(m.requested_bytes.is_some());
        assert!(!m.text.is_empty() && m.text.contains(" out of memory"));
        last = (m.line, m.end_line);
    }
    // The streaming reader (logs read piece by piece) finds exactly the same.
    let streamed =
        vramlens::devlog::oom_log::parse_oom_messages_from(std::io::Cursor::new(log.as_bytes()))
            .unwrap();
    assert_eq!(found, streamed, "the streaming reader differs");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_text_never_panics(log in "\\PC{0,300}") {
        check_invariants(&log);
    }

    #[test]
    fn random_bytes_as_text_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        check_invariants(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn fragment_soup_never_panics(parts in proptest::collection::vec(0..FRAGMENTS.len(), 0..40)) {
        let log: String = parts.iter().map(|&i| FRAGMENTS[i]).collect();
        check_invariants(&log);
    }

    #[test]
    fn mutated_real_messages_never_panic(
        which in 0..REAL.len(),
        edits in proptest::collection::vec(edit_strategy(), 1..6),
    ) {
        let mut log = REAL[which].to_string();
        for edit in &edits {
            log = apply(&log, edit);
        }
        check_invariants(&log);
    }

    #[test]
    fn two_decimal_sizes_are_exact(
        int in 0u64..1_000_000,
        cents in 0u64..100,
        unit in 0usize..5,
        space in any::<bool>(),
    ) {
        // (int + cents/100) × unit, rounded half up, in integers.
        let (name, mult) = [("bytes", 1u128), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40)][unit];
        let hundredths = (int as u128 * 100 + cents as u128) * mult;
        let expected = (hundredths + 50) / 100;
        let text = format!("{int}.{cents:02}{}{name}", if space { " " } else { "" });
        prop_assert_eq!(parse_size(&text), u64::try_from(expected).ok());
    }

    #[test]
    fn sizes_without_a_known_unit_are_not_sizes(
        number in "[0-9]{1,12}(\\.[0-9]{1,4})?",
        unit in "(x|miles|KiBs|M|)",
    ) {
        prop_assert_eq!(parse_size(&format!("{number} {unit}")), None);
    }

    #[test]
    fn sizes_round_trip_through_pytorch_format(size in 0u64..(1u64 << 50)) {
        let (text, unit) = pytorch_format_size(size);
        let parsed = parse_size(&text).unwrap();
        // Printed with two decimals: within 0.005 of the unit, plus float formatting slack.
        let tolerance = unit / 200 + 1;
        prop_assert!(parsed.abs_diff(size) <= tolerance, "{size} printed {text} read {parsed}");
    }

    #[test]
    fn every_real_message_is_found_behind_any_prefix(
        which in 0..REAL.len(),
        prefix in "[a-zA-Z0-9 \\[\\]:|,.-]{0,30}",
    ) {
        // Real messages (after the first line, for the multi-line ones) behind a prefix.
        let text = REAL[which];
        let log = format!("{prefix}{text}");
        let found = parse_oom_messages(&log);
        prop_assert!(!found.is_empty());
        let alone = parse_oom_messages(text);
        prop_assert_eq!(found.last().unwrap().requested_bytes, alone[0].requested_bytes);
    }
}

// ---------------------------------------------------------------- streaming and limits

#[test]
fn reading_line_by_line_finds_what_reading_whole_finds() {
    let mut log = String::new();
    for (i, m) in REAL.iter().enumerate() {
        log.push_str(&format!("step {i}\r\n{m}\n\n"));
    }
    let whole = parse_oom_messages(&log);
    assert_eq!(whole.len(), REAL.len());
    let streamed =
        parse_oom_messages_from(std::io::BufReader::with_capacity(7, log.as_bytes())).unwrap();
    assert_eq!(streamed, whole);
    // Line numbers are the log's: each message starts on its first line that says "out of
    // memory", after its "step" line.
    let mut step = 1;
    for (i, m) in REAL.iter().enumerate() {
        let within = m
            .lines()
            .position(|l| l.contains(" out of memory"))
            .unwrap();
        assert_eq!(whole[i].line, step + 1 + within, "message {i}");
        step += m.lines().count() + 2;
    }
}

#[test]
fn a_line_longer_than_a_piece_keeps_its_number() {
    // 3 MiB of noise on line 2, then a message on line 3.
    let log = format!("start\n{}\n{NEW_CUDA}\n", "x".repeat(3 << 20));
    let found = parse_oom_messages(&log);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].line, 3);
    assert_eq!(found[0].requested_bytes, Some(23_068_672));
    // Read through a small buffer, the long line is skipped in pieces: same numbers.
    for capacity in [7, 4096, 1 << 16] {
        let streamed =
            parse_oom_messages_from(std::io::BufReader::with_capacity(capacity, log.as_bytes()))
                .unwrap();
        assert_eq!(streamed, found, "buffer of {capacity} bytes");
    }
    // Blank lines before it are counted as lines.
    let blank = format!("{}{NEW_CUDA}\n", "\n".repeat(100_000));
    let m =
        parse_oom_messages_from(std::io::BufReader::with_capacity(1000, blank.as_bytes())).unwrap();
    assert_eq!(m[0].line, 100_001);
}

#[test]
fn an_absurd_size_is_read_and_flagged() {
    let log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1000000000000000000000000000000.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 3.44 MiB is free.";
    let m = only(log);
    assert!(m.oversized);
    assert_eq!(m.requested_bytes, Some(u64::MAX));
    assert_eq!(m.gpu, Some(0));
    // 79.15 GiB = 84986665369.6 → 84986665370
    assert_eq!(m.total_capacity_bytes, Some(84_986_665_370));
    assert!(!only(NEW_CUDA).oversized);
}
