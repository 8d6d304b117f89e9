//! What `kiln bench` reports about a model besides speed, and how it prints tables.
//!
//! Size and parameter count are llama-bench's: the sum over every tensor in the file(s) of its
//! stored bytes and of its element count (so a tied embedding counts once, and norms count).

use std::fmt;

use kiln_engine::ModelFile;
use kiln_quant::QuantMix;

/// GGUF `tokenizer.ggml.token_type` of an ordinary token (llama.cpp's `LLAMA_TOKEN_TYPE_NORMAL`).
const TOKEN_TYPE_NORMAL: i64 = 1;

/// The model as the benchmark table names it.
pub struct ModelInfo {
    /// `gemma3 268M Q4_K_M`: architecture, parameters, file type.
    pub desc: String,
    /// Bytes of all tensors.
    pub bytes: u64,
    /// Elements of all tensors.
    pub params: u64,
    /// Ids of the normal vocabulary (GGUF token type 1), when the file lists token types.
    pub normal_ids: Option<Vec<u32>>,
}

impl ModelInfo {
    /// From the tensor table of `model` (a GGUF file or a Hugging Face folder).
    pub fn of(model: &ModelFile) -> ModelInfo {
        if let Some(st) = model.checkpoint() {
            let tensors = st.tensors();
            let bytes = tensors.iter().map(|t| t.bytes.len() as u64).sum();
            let params = tensors.iter().map(|t| t.n_elements() as u64).sum();
            let ty = dominant(
                tensors
                    .iter()
                    .map(|t| (format!("{:?}", t.dtype), t.bytes.len() as u64)),
            );
            let arch = model.architecture();
            return ModelInfo {
                desc: format!("{arch} {} {ty}", size_label(params)),
                bytes,
                params,
                normal_ids: None,
            };
        }
        let Some(file) = model.gguf() else {
            // A model is a folder or a GGUF file; nothing to count otherwise.
            return ModelInfo {
                desc: model.architecture().to_string(),
                bytes: 0,
                params: 0,
                normal_ids: None,
            };
        };
        let tensors = file.tensors();
        let bytes = tensors.iter().map(|t| t.n_bytes).sum();
        let params = tensors.iter().map(|t| t.n_elements()).sum();
        let file_type = file
            .get("general.file_type")
            .and_then(|v| v.as_u64())
            .and_then(|ft| {
                QuantMix::ALL
                    .into_iter()
                    .find(|m| u64::from(m.file_type()) == ft)
            })
            .map(|m| m.name().to_uppercase());
        let ty = file_type.unwrap_or_else(|| {
            dominant(tensors.iter().map(|t| (t.ty.name().to_string(), t.n_bytes)))
        });
        let normal_ids = file
            .get("tokenizer.ggml.token_type")
            .and_then(|v| v.as_array())
            .map(|types| {
                types
                    .items
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.as_i64() == Some(TOKEN_TYPE_NORMAL))
                    .map(|(i, _)| i as u32)
                    .collect()
            });
        ModelInfo {
            desc: format!(
                "{} {} {ty}",
                file.architecture().unwrap_or("(unknown)"),
                size_label(params)
            ),
            bytes,
            params,
            normal_ids,
        }
    }
}

/// The name holding the most bytes among `(name, bytes)` pairs (`?` when there are none).
fn dominant(items: impl Iterator<Item = (String, u64)>) -> String {
    let mut totals = std::collections::BTreeMap::<String, u64>::new();
    for (name, bytes) in items {
        *totals.entry(name).or_default() += bytes;
    }
    totals
        .into_iter()
        .max_by_key(|(_, b)| *b)
        .map_or_else(|| "?".into(), |(n, _)| n)
}

/// `268M`, `1.2B`: the size a model is known by.
fn size_label(params: u64) -> String {
    let p = params as f64;
    if p >= 1e9 {
        format!("{:.1}B", p / 1e9)
    } else {
        format!("{:.0}M", p / 1e6)
    }
}

/// Bytes as llama-bench prints them: `241.41 MiB`, `1.24 GiB`.
pub fn human_bytes(b: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else if b >= MIB {
        format!("{:.2} MiB", b / MIB)
    } else {
        format!("{:.2} KiB", b / 1024.0)
    }
}

/// Counts as llama-bench prints them: `268.10 M`, `1.24 B`.
pub fn human_count(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else {
        format!("{:.2} M", n / 1e6)
    }
}

/// A Markdown table (llama-bench's layout): columns padded to their widest cell.
pub struct Table {
    /// Header and whether the column is right-aligned.
    columns: Vec<(String, bool)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&str, bool)]) -> Table {
        Table {
            columns: columns.iter().map(|&(h, r)| (h.to_string(), r)).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = |i: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(i))
                .chain(std::iter::once(&self.columns[i].0))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.columns.len()).map(width).collect();
        let line = |f: &mut fmt::Formatter<'_>, cells: &mut dyn Iterator<Item = &str>| {
            write!(f, "|")?;
            for ((cell, &(_, right)), &w) in cells.zip(&self.columns).zip(&widths) {
                let pad = w.saturating_sub(cell.chars().count());
                if right {
                    write!(f, " {}{cell} |", " ".repeat(pad))?;
                } else {
                    write!(f, " {cell}{} |", " ".repeat(pad))?;
                }
            }
            writeln!(f)
        };
        line(f, &mut self.columns.iter().map(|(h, _)| h.as_str()))?;
        write!(f, "|")?;
        for (&(_, right), &w) in self.columns.iter().zip(&widths) {
            let dashes = "-".repeat(w.saturating_sub(usize::from(right)));
            write!(f, " {dashes}{} |", if right { ":" } else { "" })?;
        }
        writeln!(f)?;
        for r in &self.rows {
            line(f, &mut r.iter().map(String::as_str))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_columns_and_align_numbers_right() {
        let mut t = Table::new(&[("model", false), ("t/s", true)]);
        t.row(vec!["gemma3".into(), "12.50 ± 0.25".into()]);
        t.row(vec!["x".into(), "1.00 ± 0.00".into()]);
        let text = t.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "| model  |          t/s |");
        assert_eq!(lines[1], "| ------ | -----------: |");
        assert_eq!(lines[2], "| gemma3 | 12.50 ± 0.25 |");
        assert_eq!(lines[3], "| x      |  1.00 ± 0.00 |");
    }

    #[test]
    fn sizes_print_as_llama_bench_prints_them() {
        assert_eq!(human_bytes(253_000_000.0), "241.28 MiB");
        assert_eq!(human_bytes(2.5 * (1u64 << 30) as f64), "2.50 GiB");
        assert_eq!(human_count(268_098_176.0), "268.10 M");
        assert_eq!(size_label(268_098_176), "268M");
        assert_eq!(size_label(1_240_000_000), "1.2B");
        assert_eq!(
            dominant([("a".into(), 1), ("b".into(), 5), ("a".into(), 3)].into_iter()),
            "b"
        );
    }
}
