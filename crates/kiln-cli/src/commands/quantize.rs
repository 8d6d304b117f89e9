//! `kiln quantize IN.gguf OUT.gguf --type TYPE`: convert a GGUF model to a quantization mix, as
//! `llama-quantize` does without an importance matrix.
//!
//! - Each tensor's type comes from [`kiln_quant::plan_types`] (llama.cpp's per-tensor rules and
//!   row-length fallbacks, see `kiln_quant::mix`). A tensor already of its planned type is
//!   copied byte for byte; any other is dequantized to f32 and quantized with
//!   [`kiln_quant::quantize`], whose bytes are those of ggml's reference quantizers. Converting
//!   a tensor that is already quantized loses more than quantizing the original weights: kiln
//!   warns once (llama-quantize refuses unless `--allow-requantize`).
//! - All metadata is copied in order, except that `general.file_type` becomes llama.cpp's
//!   `LLAMA_FTYPE` number for the mix and `general.quantization_version` 2 (both replaced in
//!   place, or appended), and the `split.*` keys of a sharded file are dropped. Tensors keep
//!   their order and the input's alignment.
//! - The output is streamed: the header is computed from the plan, then each tensor is converted
//!   in slabs of rows and written, so memory stays near one slab whatever the model's size. It
//!   goes to a temporary file next to OUT, renamed over OUT only when complete (and removed on
//!   failure).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use indicatif::ProgressBar;
use kiln_core::GgmlType;
use kiln_formats::{GgufFile, MetaValue, TensorInfo};
use kiln_quant::mix::{MixModel, MixTensor, TensorPlan};
use kiln_quant::{plan_types, QuantMix};

use super::gguf_out::{
    header, lay_out, progress_bar, write_padding, OutTensor, TempFile, SLAB_ELEMENTS,
};
use crate::load::resolve;

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// The GGUF model to convert (F32/F16/BF16 or any quantized type kiln reads), or a known
    /// model alias.
    input: String,
    /// Where to write the result (replaced only once it is complete).
    output: PathBuf,
    /// The quantization mix (case-insensitive).
    #[arg(long = "type", value_name = "TYPE", ignore_case = true, value_parser = mix_parser())]
    mix: QuantMix,
}

/// What `--help` says about each mix.
fn describe(mix: QuantMix) -> &'static str {
    use QuantMix::*;
    match mix {
        Q4_0 => "Q4_0; output Q6_K",
        Q4_1 => "Q4_1; output Q6_K",
        Q5_0 => "Q5_0; output Q6_K",
        Q5_1 => "Q5_1; output Q6_K",
        Q8_0 => "Q8_0",
        Q2_K => "Q2_K; attn_v Q3_K/Q4_K, ffn_down and attn_output Q3_K; output Q6_K",
        Q3_K_S => "Q3_K; output Q6_K",
        Q3_K_M => "Q3_K; attn_v, ffn_down and attn_output Q4_K/Q5_K; output Q6_K",
        Q3_K_L => "Q3_K; attn_v, ffn_down and attn_output Q5_K; output Q6_K",
        Q4_K_S => "Q4_K; the first attn_v and ffn_down Q5_K; output Q6_K",
        Q4_K_M => "Q4_K; half of attn_v and ffn_down Q6_K; output Q6_K",
        Q5_K_S => "Q5_K; output Q6_K",
        Q5_K_M => "Q5_K; half of attn_v and ffn_down Q6_K; output Q6_K",
        Q6_K => "Q6_K",
        F16 => "F16 (every 2-D weight)",
        BF16 => "BF16 (every 2-D weight)",
    }
}

/// `--type`: the mixes by name (case-insensitive), each with its help line.
pub(crate) fn mix_parser() -> impl TypedValueParser<Value = QuantMix> {
    let values = QuantMix::ALL.map(|m| PossibleValue::new(m.name()).help(describe(m)));
    // The names are the possible values, so the parse cannot fail; keep the error typed anyway.
    PossibleValuesParser::new(values).try_map(|s| s.parse::<QuantMix>())
}

/// One output tensor.
struct Planned<'f> {
    info: &'f TensorInfo,
    plan: TensorPlan,
    out: OutTensor<'f>,
}

impl Planned<'_> {
    fn converts(&self) -> bool {
        self.plan.ty != self.info.ty
    }
}

pub fn run(a: QuantizeArgs) -> Result<()> {
    let started = Instant::now();
    let input = input_path(&a.input)?;
    if same_file(&input, &a.output) {
        bail!(
            "the output {} is the input file: write the quantized model to another path",
            a.output.display()
        );
    }
    let file = GgufFile::open(&input).with_context(|| format!("reading {}", input.display()))?;
    let model = mix_model(&file);
    let tensors: Vec<MixTensor> = file
        .tensors()
        .iter()
        .map(|t| MixTensor {
            name: &t.name,
            dims: &t.dims,
            ty: t.ty,
        })
        .collect();
    let plans = plan_types(a.mix, &model, &tensors)
        .with_context(|| format!("choosing the tensor types of {}", input.display()))?;
    let planned = plan_layout(&file, &plans)?;
    check_sources(&planned, &input)?;

    let meta = output_metadata(&file, a.mix);
    let header = header(&meta, planned.iter().map(|p| &p.out), file.alignment());
    let mut tmp = TempFile::create(&a.output)?;
    write_model(&file, &planned, &header, &mut tmp)?;
    tmp.commit(&a.output)?;

    report(&a, &input, &file, &planned, started);
    Ok(())
}

/// IN as a path; a name that is not an existing file may be a model alias (`gemma3-270m`).
fn input_path(input: &str) -> Result<PathBuf> {
    let path = Path::new(input);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let looks_like_path = input.contains(std::path::MAIN_SEPARATOR) || input.ends_with(".gguf");
    if looks_like_path {
        bail!("{input}: no such file");
    }
    resolve(input).with_context(|| format!("{input} is neither a file nor a known model"))
}

/// Whether `output` names the same file as `input` (which exists), through any path spelling.
fn same_file(input: &Path, output: &Path) -> bool {
    let Ok(input) = input.canonicalize() else {
        return false;
    };
    if let Ok(out) = output.canonicalize() {
        return out == input;
    }
    // OUT does not exist yet: compare its directory and name.
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (dir.canonicalize(), output.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name) == input,
        _ => false,
    }
}

/// The model facts the mix rules read, from the metadata (missing keys: the rules that need
/// them do not fire, as for a model llama.cpp knows nothing special about).
fn mix_model(file: &GgufFile) -> MixModel {
    let architecture = file.architecture().unwrap_or_default().to_owned();
    let number = |key: &str| -> Option<u32> {
        let value = file.get(&format!("{architecture}.{key}"))?;
        // Per-layer arrays (some models vary heads by layer): llama.cpp's rules read layer 0.
        let first = match value {
            MetaValue::Array(array) => array.items.first()?,
            other => other,
        };
        first.as_u64().and_then(|v| u32::try_from(v).ok())
    };
    let n_layer = number("block_count").unwrap_or_else(|| {
        // No block count: one past the highest `blk.N.` layer.
        file.tensors()
            .iter()
            .filter_map(|t| {
                t.name
                    .strip_prefix("blk.")?
                    .split('.')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .max()
            .map_or(0, |n| n.saturating_add(1))
    });
    let n_head = number("attention.head_count").unwrap_or(0);
    MixModel {
        n_layer,
        n_head,
        n_head_kv: number("attention.head_count_kv").unwrap_or(n_head),
        n_expert: number("expert_count").unwrap_or(0),
        architecture,
    }
}

/// Output offsets and sizes of every tensor, in file order, each at the next aligned offset.
fn plan_layout<'f>(file: &'f GgufFile, plans: &[TensorPlan]) -> Result<Vec<Planned<'f>>> {
    let tensors = file.tensors();
    let layout = lay_out(
        tensors
            .iter()
            .zip(plans)
            .map(|(t, p)| (t.name.as_str(), t.dims.as_slice(), p.ty)),
        file.alignment(),
    )?;
    Ok(tensors
        .iter()
        .zip(plans)
        .zip(layout)
        .map(|((info, &plan), out)| Planned { info, plan, out })
        .collect())
}

/// Every tensor to convert must be readable; requantizing is allowed with one warning.
fn check_sources(planned: &[Planned], input: &Path) -> Result<()> {
    let mut requantized: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for p in planned.iter().filter(|p| p.converts()) {
        let from = p.info.ty;
        if !from.is_supported() {
            bail!(
                "{}: tensor {} is {from}, which kiln cannot read, so it cannot become {}",
                input.display(),
                p.info.name,
                p.plan.ty
            );
        }
        if from.block_size() > 1 {
            *requantized.entry(from).or_default() += 1;
        }
    }
    if !requantized.is_empty() {
        let list: Vec<String> = requantized
            .iter()
            .map(|(ty, n)| format!("{n} {ty}"))
            .collect();
        eprintln!(
            "warning: requantizing tensors that are already quantized ({}): the result is less \
             accurate than quantizing the original F32/F16/BF16 weights",
            list.join(", ")
        );
    }
    Ok(())
}

const FILE_TYPE_KEY: &str = "general.file_type";
const QUANTIZATION_VERSION_KEY: &str = "general.quantization_version";
/// ggml's `GGML_QNT_VERSION`, which llama-quantize writes.
const QUANTIZATION_VERSION: u32 = 2;

/// The input's metadata with the mix's file type and the quantization version set, and the
/// split keys of a sharded input dropped.
fn output_metadata(file: &GgufFile, mix: QuantMix) -> Vec<(String, MetaValue)> {
    let mut meta: Vec<(String, MetaValue)> = file
        .metadata()
        .iter()
        .filter(|(key, _)| !key.starts_with("split."))
        .cloned()
        .collect();
    for (key, value) in [
        (
            QUANTIZATION_VERSION_KEY,
            MetaValue::U32(QUANTIZATION_VERSION),
        ),
        (FILE_TYPE_KEY, MetaValue::U32(mix.file_type())),
    ] {
        match meta.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => meta.push((key.to_owned(), value)),
        }
    }
    meta
}

/// Writes the header and every tensor (copied or converted), each padded to the alignment.
fn write_model(
    file: &GgufFile,
    planned: &[Planned],
    header: &[u8],
    tmp: &mut TempFile,
) -> Result<()> {
    let total: u64 = planned.iter().map(|p| p.info.n_elements()).sum();
    let bar = progress_bar(total);
    let path = tmp.path.clone();
    let write_err = || format!("writing {}", path.display());
    let out = &mut tmp.writer;
    out.write_all(header).with_context(write_err)?;
    for p in planned {
        bar.set_message(p.info.name.clone());
        let src = file.tensor_data(p.info);
        if p.converts() {
            convert(&src, p, out, &bar)
                .with_context(|| format!("converting tensor {} to {}", p.info.name, p.plan.ty))?;
        } else {
            out.write_all(&src).with_context(write_err)?;
            bar.inc(p.info.n_elements());
        }
        write_padding(out, p.out.n_bytes, file.alignment()).with_context(write_err)?;
    }
    bar.finish_and_clear();
    Ok(())
}

/// Dequantizes a tensor to f32 and quantizes it to its planned type, a slab of rows at a time.
fn convert(src: &[u8], p: &Planned, out: &mut impl Write, bar: &ProgressBar) -> Result<()> {
    let (from, to) = (p.info.ty, p.plan.ty);
    let row_len = usize::try_from(p.info.dims.first().copied().unwrap_or(1))?;
    let src_row = kiln_quant::quantized_size(from, row_len)?;
    let dst_row = kiln_quant::quantized_size(to, row_len)?;
    let rows_per_slab = (SLAB_ELEMENTS / row_len.max(1)).max(1);
    let mut values = vec![0.0f32; rows_per_slab * row_len];
    let mut bytes = vec![0u8; rows_per_slab * dst_row];
    for slab in src.chunks(rows_per_slab * src_row.max(1)) {
        let rows = slab.len() / src_row.max(1);
        let (Some(values), Some(bytes)) = (
            values.get_mut(..rows * row_len),
            bytes.get_mut(..rows * dst_row),
        ) else {
            bail!("a slab of {rows} rows does not fit its buffers");
        };
        kiln_quant::dequantize(from, slab, values)?;
        kiln_quant::quantize(to, values, bytes)?;
        out.write_all(bytes)?;
        bar.inc(values.len() as u64);
    }
    Ok(())
}

/// Prints what was written: sizes, types, fallbacks, time.
fn report(a: &QuantizeArgs, input: &Path, file: &GgufFile, planned: &[Planned], started: Instant) {
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let elements: u64 = planned.iter().map(|p| p.info.n_elements()).sum();
    let bits_per_weight = |bytes: u64| 8.0 * bytes as f64 / elements.max(1) as f64;
    let before: u64 = planned.iter().map(|p| p.info.n_bytes).sum();
    let after: u64 = planned.iter().map(|p| p.out.n_bytes).sum();
    let out_size = std::fs::metadata(&a.output).map_or(0, |m| m.len());
    println!(
        "{} -> {} as {} (general.file_type {}) in {:.1} s",
        input.display(),
        a.output.display(),
        a.mix,
        a.mix.file_type(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "  tensor data: {:.2} MiB ({:.2} bits/weight) -> {:.2} MiB ({:.2} bits/weight)",
        mib(before),
        bits_per_weight(before),
        mib(after),
        bits_per_weight(after)
    );
    println!(
        "  file: {:.2} MiB -> {:.2} MiB",
        mib(file.file_size()),
        mib(out_size)
    );
    let mut by_type: BTreeMap<GgmlType, (usize, usize)> = BTreeMap::new();
    for p in planned {
        let entry = by_type.entry(p.plan.ty).or_default();
        if p.converts() {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    let counts: Vec<String> = by_type
        .iter()
        .map(|(ty, (converted, copied))| match (converted, copied) {
            (0, n) => format!("{ty} {n} (copied)"),
            (n, 0) => format!("{ty} {n}"),
            (c, k) => format!("{ty} {} ({k} copied)", c + k),
        })
        .collect();
    println!("  tensors: {}", counts.join(", "));
    let mut fallbacks: BTreeMap<(GgmlType, GgmlType, u64), Vec<&str>> = BTreeMap::new();
    for p in planned {
        if let Some(wanted) = p.plan.fallback_from {
            let row_len = p.info.dims.first().copied().unwrap_or(1);
            fallbacks
                .entry((wanted, p.plan.ty, row_len))
                .or_default()
                .push(&p.info.name);
        }
    }
    for ((wanted, got, row_len), names) in fallbacks {
        let first = names.first().copied().unwrap_or_default();
        let others = names.len().saturating_sub(1);
        let also = if others > 0 {
            format!(" and {others} more")
        } else {
            String::new()
        };
        println!(
            "  fallback: {wanted} -> {got} for rows of {row_len} (not a multiple of {}): {first}{also}",
            wanted.block_size()
        );
    }
}
