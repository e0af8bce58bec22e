//! Devices a budget is fitted against: the memory each one offers a PyTorch process, as
//! the driver reports it (`cudaMemGetInfo`'s total, what `torch.cuda.get_device_properties
//! (0).total_memory` and PyTorch's OOM message, "has a total capacity of X", show). That
//! is less than the marketing size: the driver keeps some, and ECC more.
//!
//! The figures are the "total capacity" PyTorch printed on those devices in public OOM
//! reports (GitHub issues and logs of 2024-2026, found by their exact wording), the lowest
//! one commonly seen where reports differ by a few hundred MiB with driver version and
//! ECC; the H200's is our own recording (`testdata/gpu/oom/oom.log`). A device missing
//! here is given as a size (`--gpu 24GiB`).

use serde::Serialize;

const GIB: f64 = (1u64 << 30) as f64;

/// A device and the memory it offers one process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    /// The name shown (or the size as given, for `--gpu SIZE`).
    pub name: String,
    pub capacity_bytes: u64,
    /// Where the figure comes from.
    pub source: &'static str,
    /// The name given names more than one card, and which one is taken (null when it
    /// names one).
    pub ambiguous: Option<&'static str>,
}

/// `gpus` without repeats: a device named (or sized) twice is one device, answered once,
/// at its first place.
pub fn distinct(gpus: &[Gpu]) -> Vec<Gpu> {
    let mut seen = std::collections::BTreeSet::new();
    gpus.iter()
        .filter(|g| seen.insert((g.name.clone(), g.capacity_bytes)))
        .cloned()
        .collect()
}

/// (names it is known by, lower case; shown name; capacity in GiB; source).
const TABLE: [(&[&str], &str, f64, &str); 19] = [
    (
        &["h100", "h100-80gb", "h100-sxm", "h100-pcie"],
        "H100 80GB",
        79.10,
        "PyTorch OOM messages on H100 80GB: total capacity 79.10-79.33 GiB",
    ),
    (
        &["h200", "h200-141gb"],
        "H200 141GB",
        139.80,
        "our recording on an H200 (testdata/gpu/oom/oom.log): total capacity 139.80 GiB",
    ),
    (
        &["h20", "h20-96gb"],
        "H20 96GB",
        94.97,
        "nvidia-smi lists 97871 MiB on H20, as on the 96 GB GH200; PyTorch OOM messages on such devices: total capacity 94.97 GiB",
    ),
    (
        &["gh200", "gh200-96gb", "gh200-480gb"],
        "GH200 96GB",
        94.97,
        "nvidia-smi lists 97871 MiB on GH200 (96 GB HBM3, the 480GB and 120GB systems), as on the H20; PyTorch OOM messages on such devices: total capacity 94.97 GiB; the 144 GB HBM3e GH200 is given as a size",
    ),
    (
        &["a100-80gb", "a100-80", "a100"],
        "A100 80GB",
        79.15,
        "PyTorch OOM messages on A100 80GB: total capacity 79.15 GiB",
    ),
    (
        &["a100-40gb", "a100-40"],
        "A100 40GB",
        39.39,
        "PyTorch OOM messages on A100 40GB: total capacity 39.39-39.56 GiB",
    ),
    (
        &["l40s", "l40", "rtx6000ada"],
        "L40S 48GB",
        44.34,
        "PyTorch OOM messages on 48 GB cards with ECC (L40S, L40, RTX 6000 Ada): total capacity 44.34-44.52 GiB",
    ),
    (
        &["rtxa6000", "a6000"],
        "RTX A6000 48GB",
        47.54,
        "PyTorch OOM messages on RTX A6000: total capacity 47.54 GiB",
    ),
    (
        &["a40", "a40-48gb"],
        "A40 48GB",
        44.42,
        "nvidia-smi lists 46068 MiB on A40, as on the L40S; a GPU test reading the driver's total: 44.42 GiB",
    ),
    (
        &["l4"],
        "L4 24GB",
        22.03,
        "PyTorch OOM messages on L4: total capacity 22.03 GiB",
    ),
    (
        &["a10", "a10g"],
        "A10 24GB",
        22.06,
        "PyTorch OOM messages on A10G: total capacity 22.06 GiB",
    ),
    (
        &["rtx4090", "4090"],
        "RTX 4090 24GB",
        23.55,
        "PyTorch OOM messages on 24 GB GeForce cards (RTX 4090): total capacity 23.52-23.64 GiB",
    ),
    (
        &["rtx3090", "3090", "rtx3090ti", "3090ti"],
        "RTX 3090 24GB",
        23.69,
        "PyTorch OOM messages on RTX 3090: total capacity 23.69-23.70 GiB",
    ),
    (
        &["rtx5090", "5090"],
        "RTX 5090 32GB",
        31.36,
        "PyTorch OOM messages on RTX 5090: total capacity 31.36-31.40 GiB",
    ),
    (
        &["b200"],
        "B200 180GB",
        178.35,
        "PyTorch OOM messages on B200: total capacity 178.35-178.36 GiB",
    ),
    (
        &["mi300x"],
        "MI300X 192GB",
        191.69,
        "PyTorch (ROCm) OOM messages on MI300X: total capacity 191.69-191.98 GiB",
    ),
    (
        &["mi250x", "mi250", "mi250x-gcd"],
        "MI250X 64GB (one GCD)",
        63.98,
        "PyTorch (ROCm) OOM messages on 64 GB AMD devices (each of an MI250X's two GCDs is a device of its own): total capacity 63.98 GiB",
    ),
    (
        &["v100", "v100-32gb"],
        "V100 32GB",
        31.73,
        "PyTorch OOM messages on 32 GB V100: total capacity 31.73 GiB",
    ),
    (
        &["t4"],
        "T4 16GB",
        14.56,
        "PyTorch OOM messages on T4 (Colab, Kaggle): total capacity 14.56-14.74 GiB",
    ),
];

/// Names of accelerators whose memory is not managed by PyTorch's CUDA caching
/// allocator: a snapshot of one cannot be fitted to them. (key prefix, what it is).
const NOT_CUDA: [(&str, &str); 4] = [
    (
        "gaudi",
        "Intel Gaudi (Habana) is not a CUDA device: PyTorch runs there on its own allocator, which a CUDA memory snapshot says nothing about",
    ),
    (
        "hpu",
        "an HPU (Intel Gaudi) is not a CUDA device: PyTorch runs there on its own allocator, which a CUDA memory snapshot says nothing about",
    ),
    (
        "tpu",
        "a TPU is not a CUDA device: PyTorch/XLA manages its memory, which a CUDA memory snapshot says nothing about",
    ),
    (
        "trainium",
        "AWS Trainium is not a CUDA device: its memory is managed by the Neuron runtime, which a CUDA memory snapshot says nothing about",
    ),
];

/// The devices checked when none is asked for.
pub const DEFAULT_GPUS: [&str; 6] = ["rtx4090", "l40s", "a100-80gb", "h100", "h200", "b200"];

/// The GPUs of [`DEFAULT_GPUS`], from the table.
pub fn default_gpus() -> Vec<Gpu> {
    DEFAULT_GPUS
        .iter()
        .map(|g| find(g).expect("the default GPUs are in the table"))
        .collect()
}

fn of(entry: &(&[&str], &str, f64, &'static str)) -> Gpu {
    Gpu {
        name: entry.1.to_string(),
        capacity_bytes: (entry.2 * GIB).round() as u64,
        source: entry.3,
        ambiguous: None,
    }
}

/// Names that more than one card goes by, and which the table takes.
const AMBIGUOUS: [(&str, &str); 1] = [(
    "a100",
    "a100 names the 40GB and the 80GB card: the 80GB one is taken; a100-40gb names the other",
)];

/// A device by name (any case, `-`, `_` and spaces ignored, `nvidia` dropped), or a size
/// (`24GiB`, `80G`: binary units, or a byte count).
pub fn find(text: &str) -> Result<Gpu, String> {
    let key: String = text
        .to_ascii_lowercase()
        .replace("nvidia", "")
        .chars()
        .filter(|c| !matches!(c, ' ' | '_'))
        .collect();
    let key = key.trim_matches('-').to_string();
    let compact = key.replace('-', "");
    if let Some(e) = TABLE.iter().find(|e| {
        e.0.iter()
            .any(|n| *n == key || n.replace('-', "") == compact)
    }) {
        let mut gpu = of(e);
        gpu.ambiguous = AMBIGUOUS
            .iter()
            .find(|(name, _)| *name == compact)
            .map(|(_, which)| *which);
        return Ok(gpu);
    }
    if text.trim().starts_with(|c: char| c.is_ascii_digit()) {
        let bytes = crate::units::parse_size_arg(text)?;
        return Ok(Gpu {
            name: text.trim().to_string(),
            capacity_bytes: bytes,
            source: "given as a size",
            ambiguous: None,
        });
    }
    if let Some((_, why)) = NOT_CUDA.iter().find(|(k, _)| compact.starts_with(k)) {
        return Err(format!("{text:?}: {why}"));
    }
    Err(format!(
        "unknown GPU {text:?}: the closest known are {}; or give its memory as a size such as 24GiB (the total capacity PyTorch prints in an OOM message)",
        closest(&compact).join(", ")
    ))
}

/// The three table entries whose names are nearest to `key` (edit distance over every
/// name an entry is known by; ties in table order), as "name (how to ask for it)".
fn closest(key: &str) -> Vec<String> {
    let mut scored: Vec<(usize, usize)> = TABLE
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let d =
                e.0.iter()
                    .map(|n| edit_distance(key, &n.replace('-', "")))
                    .min()
                    .unwrap_or(usize::MAX);
            (d, i)
        })
        .collect();
    scored.sort();
    scored
        .iter()
        .take(3)
        .map(|&(_, i)| format!("{} ({})", TABLE[i].1, TABLE[i].0[0]))
        .collect()
}

/// Levenshtein distance over bytes (names are ASCII; input is cut to 64 bytes).
fn edit_distance(a: &str, b: &str) -> usize {
    let a = &a.as_bytes()[..a.len().min(64)];
    let b = b.as_bytes();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Every device of the table, in its order.
pub fn all() -> Vec<Gpu> {
    TABLE.iter().map(of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_asked_for_twice_is_one() {
        let h100 = find("h100").unwrap();
        let also = find("H100-SXM").unwrap();
        let l4 = find("l4").unwrap();
        let got = distinct(&[h100.clone(), l4.clone(), also, h100.clone(), l4.clone()]);
        assert_eq!(got, vec![h100, l4]);
    }

    #[test]
    fn names_sizes_and_refusals() {
        assert_eq!(find("H100").unwrap().name, "H100 80GB");
        assert_eq!(find("nvidia-h100-80gb").unwrap().name, "H100 80GB");
        assert_eq!(find("A100_40GB").unwrap().name, "A100 40GB");
        assert_eq!(find("RTX 4090").unwrap().name, "RTX 4090 24GB");
        assert_eq!(find("24GiB").unwrap().capacity_bytes, 24 << 30);
        // 139.80 GiB, as PyTorch printed it on our H200.
        assert_eq!(
            find("h200").unwrap().capacity_bytes,
            (139.80 * (1u64 << 30) as f64).round() as u64
        );
        assert!(find("h900").unwrap_err().contains("unknown GPU \"h900\""));
        // The cards people ask for are their own entries, not a neighbour's.
        assert_eq!(find("a6000").unwrap().name, "RTX A6000 48GB");
        assert_eq!(find("RTX A6000").unwrap().name, "RTX A6000 48GB");
        assert_eq!(find("A40").unwrap().name, "A40 48GB");
        assert_eq!(find("RTX 3090").unwrap().name, "RTX 3090 24GB");
        assert_eq!(find("H20").unwrap().name, "H20 96GB");
        assert_eq!(find("GH200").unwrap().name, "GH200 96GB");
        assert_eq!(find("MI250X").unwrap().name, "MI250X 64GB (one GCD)");
        // 47.54 GiB, as PyTorch prints it on an RTX A6000.
        assert_eq!(
            find("a6000").unwrap().capacity_bytes,
            (47.54 * (1u64 << 30) as f64).round() as u64
        );
        // An unknown name: the nearest names, by edit distance.
        let e = find("a6001").unwrap_err();
        assert!(
            e.starts_with("unknown GPU \"a6001\": the closest known are RTX A6000 48GB (rtxa6000)"),
            "{e}"
        );
        let e = find("h10").unwrap_err();
        assert!(
            e.contains("H100 80GB (h100)") && e.contains("H20 96GB (h20)"),
            "{e}"
        );
        // Not CUDA: refused for what it is.
        let e = find("Gaudi2").unwrap_err();
        assert!(e.contains("is not a CUDA device"), "{e}");
        // Every name in the table is unique to its entry.
        let mut names: Vec<String> = TABLE
            .iter()
            .flat_map(|e| e.0.iter().map(|n| n.replace('-', "")))
            .collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(DEFAULT_GPUS.iter().all(|g| find(g).is_ok()));
    }
}
