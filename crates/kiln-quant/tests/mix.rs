//! The per-tensor types of the quantization mixes, checked on llama-shaped tensor lists against
//! llama.cpp's rules written out by hand (layer sets spelled as numbers, not recomputed).

use kiln_core::GgmlType;
use kiln_quant::mix::{allows_quantization, MixModel, MixTensor, TensorPlan};
use kiln_quant::{plan_types, QuantError, QuantMix};

use GgmlType::*;

struct Model {
    names: Vec<String>,
    dims: Vec<Vec<u64>>,
    types: Vec<GgmlType>,
}

impl Model {
    fn new() -> Self {
        Model {
            names: vec![],
            dims: vec![],
            types: vec![],
        }
    }

    fn add(&mut self, name: &str, dims: &[u64], ty: GgmlType) {
        self.names.push(name.to_owned());
        self.dims.push(dims.to_vec());
        self.types.push(ty);
    }

    /// A llama-style model: `n_layer` layers of width 4096 (GQA 32/8), FFN 11008, F16 weights.
    fn llama(n_layer: usize, tied: bool) -> Self {
        let mut m = Model::new();
        m.add("token_embd.weight", &[4096, 32000], F16);
        m.add("output_norm.weight", &[4096], F32);
        if !tied {
            m.add("output.weight", &[4096, 32000], F16);
        }
        m.add("rope_freqs.weight", &[64], F32);
        for i in 0..n_layer {
            let t = |s: &str| format!("blk.{i}.{s}.weight");
            m.add(&t("attn_norm"), &[4096], F32);
            m.add(&t("attn_q"), &[4096, 4096], F16);
            m.add(&t("attn_k"), &[4096, 1024], F16);
            m.add(&t("attn_v"), &[4096, 1024], F16);
            m.add(&t("attn_output"), &[4096, 4096], F16);
            m.add(&t("ffn_norm"), &[4096], F32);
            m.add(&t("ffn_gate"), &[4096, 11008], F16);
            m.add(&t("ffn_up"), &[4096, 11008], F16);
            m.add(&t("ffn_down"), &[11008, 4096], F16);
        }
        m
    }

    fn tensors(&self) -> Vec<MixTensor<'_>> {
        (0..self.names.len())
            .map(|i| MixTensor {
                name: &self.names[i],
                dims: &self.dims[i],
                ty: self.types[i],
            })
            .collect()
    }

    fn plan(&self, mix: QuantMix, info: &MixModel) -> Vec<(String, TensorPlan)> {
        let plans = plan_types(mix, info, &self.tensors()).unwrap();
        self.names.iter().cloned().zip(plans).collect()
    }
}

fn info(arch: &str, n_layer: u32, n_head: u32, n_head_kv: u32, n_expert: u32) -> MixModel {
    MixModel {
        architecture: arch.to_owned(),
        n_layer,
        n_head,
        n_head_kv,
        n_expert,
    }
}

fn type_of(plan: &[(String, TensorPlan)], name: &str) -> GgmlType {
    plan.iter().find(|(n, _)| n == name).unwrap().1.ty
}

fn layer_types(plan: &[(String, TensorPlan)], part: &str, n_layer: usize) -> Vec<GgmlType> {
    (0..n_layer)
        .map(|i| type_of(plan, &format!("blk.{i}.{part}.weight")))
        .collect()
}

/// `hi` on the listed layers, `lo` elsewhere.
fn on_layers(n_layer: usize, layers: &[usize], hi: GgmlType, lo: GgmlType) -> Vec<GgmlType> {
    (0..n_layer)
        .map(|i| if layers.contains(&i) { hi } else { lo })
        .collect()
}

/// llama.cpp's use-more-bits layers of a 32-layer model: 0-3, 28-31, and 6, 9, ..., 27.
const MORE_BITS_32: [usize; 16] = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31];

#[test]
fn q4_k_m_on_a_llama() {
    let model = Model::llama(32, false);
    let plan = model.plan(QuantMix::Q4_K_M, &info("llama", 32, 32, 8, 0));
    let more_bits = on_layers(32, &MORE_BITS_32, Q6_K, Q4_K);
    assert_eq!(layer_types(&plan, "attn_v", 32), more_bits);
    assert_eq!(layer_types(&plan, "ffn_down", 32), more_bits);
    for part in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
        assert_eq!(layer_types(&plan, part, 32), vec![Q4_K; 32], "{part}");
    }
    for part in ["attn_norm", "ffn_norm"] {
        assert_eq!(layer_types(&plan, part, 32), vec![F32; 32], "{part}");
    }
    assert_eq!(type_of(&plan, "output.weight"), Q6_K);
    assert_eq!(type_of(&plan, "token_embd.weight"), Q4_K);
    assert_eq!(type_of(&plan, "rope_freqs.weight"), F32);
    assert!(plan.iter().all(|(_, p)| p.fallback_from.is_none()));
}

#[test]
fn the_counters_follow_llamas_tensor_order_not_the_files() {
    // llama.cpp walks tensors by layer number, then name; a file listing them in another order
    // (here reversed, so blk.31 first and "blk.10" before "blk.9" by name) gets the same types.
    let model = Model::llama(32, false);
    let mut reversed = Model::new();
    for i in (0..model.names.len()).rev() {
        reversed.add(&model.names[i], &model.dims[i], model.types[i]);
    }
    let info = info("llama", 32, 32, 8, 0);
    for mix in [QuantMix::Q4_K_M, QuantMix::Q3_K_M, QuantMix::Q4_K_S] {
        let mut a = model.plan(mix, &info);
        let mut b = reversed.plan(mix, &info);
        a.sort_by(|x, y| x.0.cmp(&y.0));
        b.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(a, b, "{mix}");
    }
}

#[test]
fn tied_embeddings_are_quantized_like_the_output() {
    let model = Model::llama(8, true);
    let plan = model.plan(QuantMix::Q4_K_M, &info("llama", 8, 32, 8, 0));
    assert_eq!(type_of(&plan, "token_embd.weight"), Q6_K);
    let plan = model.plan(QuantMix::Q8_0, &info("llama", 8, 32, 8, 0));
    assert_eq!(type_of(&plan, "token_embd.weight"), Q8_0);
    // Q4_0 has no rule of its own but still puts the output at Q6_K.
    let plan = model.plan(QuantMix::Q4_0, &info("llama", 8, 32, 8, 0));
    assert_eq!(type_of(&plan, "token_embd.weight"), Q6_K);
    assert_eq!(layer_types(&plan, "ffn_down", 8), vec![Q4_0; 8]);
}

#[test]
fn the_other_k_mixes() {
    let model = Model::llama(32, false);
    let llama = info("llama", 32, 32, 8, 0);

    let plan = model.plan(QuantMix::Q3_K_M, &llama);
    assert_eq!(
        layer_types(&plan, "attn_v", 32),
        on_layers(32, &[0, 1], Q5_K, Q4_K)
    );
    assert_eq!(
        layer_types(&plan, "ffn_down", 32),
        on_layers(32, &[0, 1], Q5_K, Q4_K)
    );
    assert_eq!(layer_types(&plan, "attn_output", 32), vec![Q4_K; 32]);
    assert_eq!(layer_types(&plan, "attn_q", 32), vec![Q3_K; 32]);

    let plan = model.plan(QuantMix::Q3_K_L, &llama);
    for part in ["attn_v", "ffn_down", "attn_output"] {
        assert_eq!(layer_types(&plan, part, 32), vec![Q5_K; 32], "{part}");
    }

    let plan = model.plan(QuantMix::Q4_K_S, &llama);
    let first_four = on_layers(32, &[0, 1, 2, 3], Q5_K, Q4_K);
    assert_eq!(layer_types(&plan, "attn_v", 32), first_four);
    assert_eq!(layer_types(&plan, "ffn_down", 32), first_four);

    let plan = model.plan(QuantMix::Q5_K_M, &llama);
    let more_bits = on_layers(32, &MORE_BITS_32, Q6_K, Q5_K);
    assert_eq!(layer_types(&plan, "attn_v", 32), more_bits);
    assert_eq!(layer_types(&plan, "ffn_down", 32), more_bits);

    // Q2_K: attention V at Q4_K with 4 or more query heads per KV head, Q3_K otherwise.
    let plan = model.plan(QuantMix::Q2_K, &llama);
    assert_eq!(layer_types(&plan, "attn_v", 32), vec![Q4_K; 32]);
    assert_eq!(layer_types(&plan, "ffn_down", 32), vec![Q3_K; 32]);
    assert_eq!(layer_types(&plan, "attn_output", 32), vec![Q3_K; 32]);
    assert_eq!(layer_types(&plan, "attn_q", 32), vec![Q2_K; 32]);
    let plan = model.plan(QuantMix::Q2_K, &info("llama", 32, 32, 16, 0));
    assert_eq!(layer_types(&plan, "attn_v", 32), vec![Q3_K; 32]);

    for (mix, ty) in [
        (QuantMix::Q3_K_S, Q3_K),
        (QuantMix::Q5_K_S, Q5_K),
        (QuantMix::Q6_K, Q6_K),
    ] {
        let plan = model.plan(mix, &llama);
        for part in ["attn_v", "ffn_down", "attn_output", "attn_q"] {
            assert_eq!(layer_types(&plan, part, 32), vec![ty; 32], "{mix} {part}");
        }
        assert_eq!(type_of(&plan, "output.weight"), Q6_K);
    }
}

#[test]
fn a_70b_llama_gets_q5_k_attention_v() {
    let model = Model::llama(80, false);
    let plan = model.plan(QuantMix::Q3_K_S, &info("llama", 80, 64, 8, 0));
    assert_eq!(layer_types(&plan, "attn_v", 80), vec![Q5_K; 80]);
    // Not for another architecture with 80 layers, nor for a 65B without GQA.
    let plan = model.plan(QuantMix::Q3_K_S, &info("gemma3", 80, 64, 8, 0));
    assert_eq!(layer_types(&plan, "attn_v", 80), vec![Q3_K; 80]);
    let plan = model.plan(QuantMix::Q3_K_S, &info("llama", 80, 64, 64, 0));
    assert_eq!(layer_types(&plan, "attn_v", 80), vec![Q3_K; 80]);
}

#[test]
fn experts_read_their_layer_from_the_name() {
    // qwen3moe-style: 3-D expert tensors, a router that is never quantized.
    let mut model = Model::new();
    model.add("token_embd.weight", &[2048, 1000], BF16);
    for i in 0..16 {
        let t = |s: &str| format!("blk.{i}.{s}.weight");
        model.add(&t("attn_v"), &[2048, 512], BF16);
        model.add(&t("ffn_gate_inp"), &[2048, 128], F32);
        model.add(&t("ffn_down_exps"), &[768, 2048, 128], BF16);
        model.add(&t("ffn_up_exps"), &[2048, 768, 128], BF16);
    }
    let plan = model.plan(QuantMix::Q4_K_M, &info("qwen3moe", 16, 32, 4, 128));
    // 16 layers: use-more-bits are 0, 1, 4, 7, 10, 13, 14, 15.
    let more_bits = on_layers(16, &[0, 1, 4, 7, 10, 13, 14, 15], Q6_K, Q4_K);
    assert_eq!(layer_types(&plan, "ffn_down_exps", 16), more_bits);
    assert_eq!(layer_types(&plan, "ffn_gate_inp", 16), vec![F32; 16]);
    assert_eq!(layer_types(&plan, "ffn_up_exps", 16), vec![Q4_K; 16]);
    assert_eq!(type_of(&plan, "token_embd.weight"), Q6_K);

    // A layer number outside the model is an error, as in llama.cpp.
    let mut bad = Model::new();
    bad.add("blk.16.ffn_down_exps.weight", &[768, 2048, 128], BF16);
    let err = plan_types(
        QuantMix::Q4_K_M,
        &info("qwen3moe", 16, 32, 4, 128),
        &bad.tensors(),
    )
    .unwrap_err();
    assert!(matches!(err, QuantError::MixLayer { .. }), "{err}");
}

#[test]
fn eight_experts_move_attention_to_q8_0_and_q5_k() {
    let model = Model::llama(4, false);
    let plan = model.plan(QuantMix::Q4_K_M, &info("llama", 4, 32, 8, 8));
    assert_eq!(layer_types(&plan, "attn_v", 4), vec![Q8_0; 4]);
    assert_eq!(layer_types(&plan, "attn_k", 4), vec![Q8_0; 4]);
    assert_eq!(layer_types(&plan, "attn_output", 4), vec![Q5_K; 4]);
}

#[test]
fn rows_that_do_not_fit_the_blocks_fall_back() {
    let mut model = Model::new();
    model.add("blk.0.attn_q.weight", &[640, 640], F32);
    model.add("blk.0.attn_k.weight", &[96, 640], F32);
    model.add("blk.0.attn_output.weight", &[100, 640], F32);
    model.add("output.weight", &[640, 1000], F32);
    model.add("blk.0.ffn_up.weight", &[640, 1], F32);
    let plan = model.plan(QuantMix::Q4_K_M, &info("gemma3", 1, 4, 1, 0));
    let fell = |name: &str| plan.iter().find(|(n, _)| n == name).unwrap().1;
    let expect = |ty, from| TensorPlan {
        ty,
        fallback_from: from,
    };
    assert_eq!(fell("blk.0.attn_q.weight"), expect(Q5_0, Some(Q4_K)));
    assert_eq!(fell("blk.0.attn_k.weight"), expect(Q5_0, Some(Q4_K)));
    assert_eq!(fell("blk.0.attn_output.weight"), expect(F16, Some(Q4_K)));
    // The output rule itself picks Q8_0 when the mix's blocks do not divide the row.
    assert_eq!(fell("output.weight"), expect(Q8_0, None));
    // A [640, 1] tensor is 1-D for ggml: never converted.
    assert_eq!(fell("blk.0.ffn_up.weight"), expect(F32, None));

    for (mix, wanted, got) in [
        (QuantMix::Q2_K, Q2_K, Q4_0),
        (QuantMix::Q3_K_S, Q3_K, Q4_0),
        (QuantMix::Q5_K_S, Q5_K, Q5_1),
        (QuantMix::Q6_K, Q6_K, Q8_0),
    ] {
        let plan = model.plan(mix, &info("gemma3", 1, 4, 1, 0));
        assert_eq!(plan[0].1, expect(got, Some(wanted)), "{mix}");
    }
}

#[test]
fn float_mixes_convert_every_weight_and_nothing_else() {
    let model = Model::llama(2, false);
    for (mix, ty) in [(QuantMix::F16, F16), (QuantMix::BF16, BF16)] {
        let plan = model.plan(mix, &info("llama", 2, 32, 8, 0));
        for (name, p) in &plan {
            let eligible =
                name.ends_with("weight") && !name.contains("norm") && name != "rope_freqs.weight";
            assert_eq!(p.ty, if eligible { ty } else { F32 }, "{mix} {name}");
        }
    }
}

#[test]
fn which_tensors_are_converted() {
    assert!(allows_quantization("blk.0.attn_q.weight", &[64, 64]));
    assert!(allows_quantization(
        "blk.0.ffn_down_exps.weight",
        &[64, 64, 8]
    ));
    assert!(!allows_quantization("blk.0.attn_norm.weight", &[64]));
    assert!(!allows_quantization("blk.0.attn_q_norm.weight", &[64, 64]));
    assert!(!allows_quantization("blk.0.attn_q.bias", &[64, 64]));
    assert!(!allows_quantization("blk.0.ffn_gate_inp.weight", &[64, 8]));
    assert!(!allows_quantization("rope_factors_long.weight", &[32]));
    assert!(!allows_quantization("position_embd.weight", &[64, 512]));
    assert!(!allows_quantization("blk.0.attn_q.weight", &[64, 1, 1]));
}

#[test]
fn names_numbers_and_defaults() {
    for mix in QuantMix::ALL {
        assert_eq!(mix.name().parse::<QuantMix>(), Ok(mix));
        assert_eq!(mix.name().to_uppercase().parse::<QuantMix>(), Ok(mix));
    }
    let err = "q4_k_x".parse::<QuantMix>().unwrap_err();
    assert_eq!(err, QuantError::UnknownMix("q4_k_x".into()));
    assert!(err.to_string().contains("q4_k_m"), "{err}");
    // llama.h's LLAMA_FTYPE_MOSTLY_* numbers.
    let numbers: Vec<u32> = QuantMix::ALL.iter().map(|m| m.file_type()).collect();
    assert_eq!(
        numbers,
        [2, 3, 8, 9, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 1, 32]
    );
    assert_eq!(QuantMix::Q4_K_M.default_type(), Q4_K);
    assert_eq!(QuantMix::Q3_K_L.default_type(), Q3_K);
}
