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
}

/// (names it is known by, lower case; shown name; capacity in GiB; source).
const TABLE: [(&[&str], &str, f64, &str); 13] = [
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
        &["l40s", "l40", "a6000", "rtx6000ada"],
        "L40S 48GB",
        44.34,
        "PyTorch OOM messages on 48 GB cards (L40S, L40, RTX A6000): total capacity 44.34-44.52 GiB",
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

/// The devices checked when none is asked for.
pub const DEFAULT_GPUS: [&str; 6] = ["rtx4090", "l40s", "a100-80gb", "h100", "h200", "b200"];

fn of(entry: &(&[&str], &str, f64, &'static str)) -> Gpu {
    Gpu {
        name: entry.1.to_string(),
        capacity_bytes: (entry.2 * GIB).round() as u64,
        source: entry.3,
    }
}

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
        return Ok(of(e));
    }
    if text.trim().starts_with(|c: char| c.is_ascii_digit()) {
        let bytes = crate::units::parse_size_arg(text)?;
        return Ok(Gpu {
            name: text.trim().to_string(),
            capacity_bytes: bytes,
            source: "given as a size",
        });
    }
    let names: Vec<&str> = TABLE.iter().map(|e| e.0[0]).collect();
    Err(format!(
        "unknown GPU {text:?}: expected one of {} or a size such as 24GiB",
        names.join(", ")
    ))
}

/// Every device of the table, in its order.
pub fn all() -> Vec<Gpu> {
    TABLE.iter().map(of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(DEFAULT_GPUS.iter().all(|g| find(g).is_ok()));
    }
}
