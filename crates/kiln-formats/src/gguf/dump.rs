//! A human-readable dump of a GGUF file, in the spirit of llama.cpp's `gguf-dump`: the header,
//! the metadata in file order (arrays abbreviated, long strings truncated), then a tensor table
//! and totals.
//!
//! Output stays small and safe to print whatever the file holds: at most
//! [`DumpOptions::max_array_items`] items of an array are shown (counted across nested arrays),
//! strings are cut at [`MAX_STRING_CHARS`] characters, and control characters in keys, names and
//! strings are escaped so that a hostile file cannot drive the terminal.

use std::collections::BTreeMap;
use std::io::{self, Write};

use kiln_core::GgmlType;

use super::reader::GgufFile;
use super::tensor::TensorInfo;
use super::value::{MetaArray, MetaType, MetaValue};

/// Characters of a string value shown before it is truncated.
pub const MAX_STRING_CHARS: usize = 80;
/// Characters of a key or tensor name shown before it is truncated.
const MAX_NAME_CHARS: usize = 120;

/// What [`write_dump`] shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpOptions {
    /// Items of an array shown before `... (N more)`.
    pub max_array_items: usize,
    /// Whether to print one line per tensor (the totals are always printed).
    pub show_tensors: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            max_array_items: 8,
            show_tensors: true,
        }
    }
}

/// Writes the dump of `file` to `out`.
pub fn write_dump(file: &GgufFile, out: &mut dyn Write, opts: &DumpOptions) -> io::Result<()> {
    let data_bytes = file.file_size().saturating_sub(file.data_offset());
    writeln!(
        out,
        "GGUF version {}, little-endian, {} bytes",
        file.version(),
        file.file_size()
    )?;
    writeln!(
        out,
        "  alignment {}, data section at byte {} ({} bytes)",
        file.alignment(),
        file.data_offset(),
        data_bytes
    )?;
    writeln!(
        out,
        "  {} metadata key/value pairs, {} tensors",
        file.metadata().len(),
        file.tensors().len()
    )?;

    writeln!(out)?;
    writeln!(out, "Metadata ({} pairs):", file.metadata().len())?;
    let labels: Vec<String> = file.metadata().iter().map(|(_, v)| type_label(v)).collect();
    let label_width = labels.iter().map(String::len).max().unwrap_or(0);
    for (i, ((key, value), label)) in file.metadata().iter().zip(&labels).enumerate() {
        let mut rendered = String::new();
        let mut budget = opts.max_array_items;
        render_value(value, &mut budget, &mut rendered);
        writeln!(
            out,
            "{:>6}  {label:<label_width$}  {} = {rendered}",
            i + 1,
            printable(key, MAX_NAME_CHARS)
        )?;
    }

    writeln!(out)?;
    if opts.show_tensors {
        write_tensor_table(file.tensors(), out)?;
    }
    write_totals(file.tensors(), out)
}

fn write_tensor_table(tensors: &[TensorInfo], out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "Tensors ({}):", tensors.len())?;
    let names: Vec<String> = tensors
        .iter()
        .map(|t| printable(&t.name, MAX_NAME_CHARS))
        .collect();
    let shapes: Vec<String> = tensors.iter().map(|t| format!("{:?}", t.dims)).collect();
    let name_width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let shape_width = shapes.iter().map(String::len).max().unwrap_or(0).max(5);
    writeln!(
        out,
        "{:>6}  {:<name_width$}  {:<7}  {:<shape_width$}  {:>12}  {:>12}",
        "#", "name", "type", "shape", "bytes", "offset"
    )?;
    for (i, ((t, name), shape)) in tensors.iter().zip(&names).zip(&shapes).enumerate() {
        writeln!(
            out,
            "{:>6}  {name:<name_width$}  {:<7}  {shape:<shape_width$}  {:>12}  {:>12}",
            i,
            t.ty.name(),
            t.n_bytes,
            t.offset
        )?;
    }
    writeln!(out)
}

fn write_totals(tensors: &[TensorInfo], out: &mut dyn Write) -> io::Result<()> {
    let mut by_type: BTreeMap<GgmlType, (u64, u64, u64)> = BTreeMap::new();
    let (mut elements, mut bytes) = (0u64, 0u64);
    for t in tensors {
        let entry = by_type.entry(t.ty).or_default();
        entry.0 += 1;
        entry.1 = entry.1.saturating_add(t.n_elements());
        entry.2 = entry.2.saturating_add(t.n_bytes);
        elements = elements.saturating_add(t.n_elements());
        bytes = bytes.saturating_add(t.n_bytes);
    }
    let bits_per_weight = |bytes: u64, elements: u64| {
        if elements == 0 {
            0.0
        } else {
            bytes as f64 * 8.0 / elements as f64
        }
    };
    writeln!(
        out,
        "Total: {} tensors, {} elements, {} bytes ({:.2} MiB, {:.2} bits per weight)",
        tensors.len(),
        elements,
        bytes,
        bytes as f64 / (1024.0 * 1024.0),
        bits_per_weight(bytes, elements)
    )?;
    for (ty, (count, elements, bytes)) in by_type {
        writeln!(
            out,
            "  {:<7} {count:>6} tensors  {elements:>14} elements  {bytes:>14} bytes  {:>6.2} bpw",
            ty.name(),
            bits_per_weight(bytes, elements)
        )?;
    }
    Ok(())
}

/// `UINT32`, `[STRING; 262144]`, `[ARRAY; 3]`.
fn type_label(value: &MetaValue) -> String {
    match value {
        MetaValue::Array(a) => format!("[{}; {}]", a.elem_type.name(), a.len()),
        other => other.meta_type().name().to_owned(),
    }
}

/// Appends `value` to `out`; `budget` is the number of array items still allowed, shared by
/// nested arrays so that the output of one value stays bounded.
fn render_value(value: &MetaValue, budget: &mut usize, out: &mut String) {
    use std::fmt::Write as _;
    // Writing into a String cannot fail.
    let _ = match value {
        MetaValue::U8(v) => write!(out, "{v}"),
        MetaValue::I8(v) => write!(out, "{v}"),
        MetaValue::U16(v) => write!(out, "{v}"),
        MetaValue::I16(v) => write!(out, "{v}"),
        MetaValue::U32(v) => write!(out, "{v}"),
        MetaValue::I32(v) => write!(out, "{v}"),
        MetaValue::U64(v) => write!(out, "{v}"),
        MetaValue::I64(v) => write!(out, "{v}"),
        MetaValue::F32(v) => write!(out, "{v:?}"),
        MetaValue::F64(v) => write!(out, "{v:?}"),
        MetaValue::Bool(v) => write!(out, "{v}"),
        MetaValue::String(s) => write!(out, "\"{}\"", printable(s, MAX_STRING_CHARS)),
        MetaValue::Array(a) => {
            render_array(a, budget, out);
            Ok(())
        }
    };
}

fn render_array(array: &MetaArray, budget: &mut usize, out: &mut String) {
    out.push('[');
    let mut shown = 0;
    for item in &array.items {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        if shown > 0 {
            out.push_str(", ");
        }
        if item.meta_type() == MetaType::Array {
            out.push_str(&type_label(item));
            out.push(' ');
        }
        render_value(item, budget, out);
        shown += 1;
    }
    let hidden = array.len() - shown;
    if hidden > 0 {
        if shown > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("... ({hidden} more)"));
    }
    out.push(']');
}

/// `s` with control characters, quotes and backslashes escaped, cut at `max_chars` characters.
fn printable(s: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    for c in chars.by_ref().take(max_chars) {
        if c.is_control() || c == '"' || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    let rest = chars.count();
    if rest > 0 {
        out.push_str(&format!("...(+{rest} chars)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_and_cut() {
        assert_eq!(printable("a\nb\"\u{1b}", 10), "a\\nb\\\"\\u{1b}");
        assert_eq!(printable("abcdef", 3), "abc...(+3 chars)");
    }

    #[test]
    fn nested_arrays_share_one_item_budget() {
        let inner = |n: u8| {
            MetaValue::from(MetaArray::new(
                MetaType::U8,
                (0..n).map(MetaValue::U8).collect(),
            ))
        };
        let outer = MetaValue::from(MetaArray::new(
            MetaType::Array,
            vec![inner(3), inner(4), inner(0)],
        ));
        let mut out = String::new();
        let mut budget = 5;
        render_value(&outer, &mut budget, &mut out);
        assert_eq!(
            out,
            "[[UINT8; 3] [0, 1, 2], [UINT8; 4] [... (4 more)], ... (1 more)]"
        );
    }
}
