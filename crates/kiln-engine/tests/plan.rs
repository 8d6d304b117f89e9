//! The planner on described machines: which placements fit, which is chosen, refusals with
//! numbers, `--gpu-layers` and memory caps. The model is a Llama-3-8B-shaped tensor table
//! (Q4_K matrices, the sizes a real Q4_K file has) and the GPU a described device: no weight
//! and no GPU is needed to decide a plan.

use kiln_core::config::{DecoderConfig, FfnActivation, LayerAttention, RopeConfig, RopeKind};
use kiln_core::GgmlType;
use kiln_engine::plan::{
    plan, BackendChoice, Device, DeviceKind, Hardware, ModelCost, ModelShape, Place, Placement,
    PlanError, PlanRequest, Rates, TensorCost, HEADROOM, PROBE_ROWS,
};

const GIB: u64 = 1 << 30;

fn llama8b() -> ModelCost {
    let (d, layers, heads, kv_heads, hd, ffn, vocab) = (4096, 32, 32, 8, 128, 14336, 128256);
    let config = DecoderConfig {
        arch: "llama".into(),
        vocab_size: vocab,
        d_model: d,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: hd,
        head_dim_v: hd,
        ffn_dim: ffn,
        norm_eps: 1e-5,
        context_length: 131072,
        rope_kind: RopeKind::Normal,
        rope_dim: hd,
        rope_global: RopeConfig::plain(5e5),
        rope_local: RopeConfig::plain(5e5),
        rope_long: None,
        rope_dynamic: None,
        layer_attention: vec![LayerAttention::Global; layers],
        attention_scale: 1.0 / (hd as f32).sqrt(),
        attn_logit_softcap: None,
        activation: FfnActivation::Silu,
        embed_scale: None,
        moe: None,
    };
    let t = |name: String, ty: GgmlType, k: usize, n: usize, place: Place| TensorCost {
        name,
        ty,
        k: k as u64,
        n: n as u64,
        bytes: ty.row_bytes(k as u64).unwrap() * n as u64,
        place,
        expert: false,
    };
    let mut tensors = vec![
        t(
            "token_embd.weight".into(),
            GgmlType::Q4_K,
            d,
            vocab,
            Place::Embedding,
        ),
        t(
            "output_norm.weight".into(),
            GgmlType::F32,
            d,
            1,
            Place::Head,
        ),
        t(
            "output.weight".into(),
            GgmlType::Q6_K,
            d,
            vocab,
            Place::Head,
        ),
    ];
    for l in 0..layers {
        let at = Place::Layer(l);
        for (role, k, n) in [
            ("attn_q", d, heads * hd),
            ("attn_k", d, kv_heads * hd),
            ("attn_v", d, kv_heads * hd),
            ("attn_output", heads * hd, d),
            ("ffn_gate", d, ffn),
            ("ffn_up", d, ffn),
            ("ffn_down", ffn, d),
        ] {
            tensors.push(t(
                format!("blk.{l}.{role}.weight"),
                GgmlType::Q4_K,
                k,
                n,
                at,
            ));
        }
        for role in ["attn_norm", "ffn_norm"] {
            tensors.push(t(format!("blk.{l}.{role}.weight"), GgmlType::F32, d, 1, at));
        }
    }
    ModelCost {
        shape: ModelShape::Decoder(config),
        tensors,
        tied_output: false,
        kv_dtype: kiln_backend::KvDtype::F32,
    }
}

fn rates(bandwidth: f64, gmacs: f64) -> Rates {
    let mut r = Rates {
        bandwidth,
        attention: [(llama8b().attention_shape().key(), gmacs * 1e9)].into(),
        elementwise: 1e-9 / gmacs,
        product_latency: 5e-6,
        op_latency: 1e-6,
        ..Rates::default()
    };
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        r.matmul.insert(
            ty.to_string(),
            PROBE_ROWS.iter().map(|_| gmacs * 1e9).collect(),
        );
    }
    r
}

/// A machine with `ram` bytes free and GPUs with `gpus` bytes free each.
fn machine(ram: u64, gpus: &[u64]) -> Hardware {
    Hardware {
        cpu: Device {
            kind: DeviceKind::Cpu,
            name: "cpu".into(),
            memory_free: ram,
            memory_total: ram,
            rates: rates(50e9, 100.0),
            link_bandwidth: 0.0,
            link_latency: 0.0,
        },
        cpu_model: "test".into(),
        cores: 8,
        simd: "AVX2".into(),
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, &free)| Device {
                kind: DeviceKind::Vulkan { index: i },
                name: format!("vulkan:{i}"),
                memory_free: free,
                memory_total: free,
                rates: rates(2000e9, 100_000.0),
                link_bandwidth: 25e9,
                link_latency: 10e-6,
            })
            .collect(),
    }
}

fn request(ctx: usize) -> PlanRequest {
    PlanRequest {
        ctx,
        batch: 1,
        prompt: 512,
        backend: BackendChoice::Auto,
        gpu_layers: None,
        kv_budget: None,
        split: true,
    }
}

#[test]
fn the_whole_model_goes_to_a_gpu_that_holds_it() {
    let p = plan(&llama8b(), &machine(64 * GIB, &[80 * GIB]), &request(4096)).unwrap();
    let c = p.require().unwrap();
    assert_eq!(c.placement, Placement::Vulkan { gpu: 0 });
    let names: Vec<String> = p.candidates.iter().map(|c| c.placement.name()).collect();
    assert!(names.contains(&"cpu".to_string()), "{names:?}");
    // The GPU plan is predicted faster than the CPU one, the split in between.
    let tps = |pl: &dyn Fn(&Placement) -> bool| {
        p.candidates
            .iter()
            .find(|c| pl(&c.placement))
            .unwrap()
            .prediction
            .as_ref()
            .unwrap()
            .decode_tps
            .unwrap()
    };
    let cpu = tps(&|p| *p == Placement::Cpu);
    let gpu = tps(&|p| matches!(p, Placement::Vulkan { .. }));
    assert!(gpu > 5.0 * cpu, "gpu {gpu} cpu {cpu}");
}

#[test]
fn a_capped_gpu_gets_the_most_layers_that_fit() {
    let cost = llama8b();
    let req = request(4096);
    // 3 GiB: about half the 4.6 GiB of weights.
    let hw = machine(64 * GIB, &[3 * GIB]);
    let p = plan(&cost, &hw, &req).unwrap();
    let c = p.require().unwrap();
    let Placement::Split {
        gpu: 0,
        gpu_layers: n,
    } = c.placement
    else {
        panic!("chose {:?}", c.placement);
    };
    assert!(n > 0 && n < 32, "{n}");
    assert!(
        c.uses[0].fits() && c.uses[0].needed <= 3 * GIB,
        "{:?}",
        c.uses[0]
    );
    // One more layer would not fit.
    let one_more = PlanRequest {
        gpu_layers: Some(n + 1),
        ..req
    };
    let q = plan(&cost, &hw, &one_more).unwrap();
    assert!(!q.candidates[0].fits, "{}", q.candidates[0].reason);
    assert!(q.require().is_err());
    // Whole-model GPU does not fit and says so with the numbers.
    let whole = p
        .candidates
        .iter()
        .find(|c| matches!(c.placement, Placement::Vulkan { .. }))
        .unwrap();
    assert!(!whole.fits);
    assert!(
        whole.reason.contains("does not fit") && whole.reason.contains("MiB"),
        "{}",
        whole.reason
    );
    // The split's GPU part: the embedding and layers 0..n; the CPU part the rest and the head.
    assert_eq!(c.uses[0].layers, 0..n);
    assert_eq!(c.uses[1].layers, n..32);
    let prediction = c.prediction.as_ref().unwrap();
    let cpu = p
        .candidates
        .iter()
        .find(|c| c.placement == Placement::Cpu)
        .unwrap();
    assert!(prediction.decode_tps.unwrap() > cpu.prediction.as_ref().unwrap().decode_tps.unwrap());
}

#[test]
fn gpu_layers_override_the_choice() {
    let cost = llama8b();
    let hw = machine(64 * GIB, &[80 * GIB]);
    let req = PlanRequest {
        gpu_layers: Some(10),
        ..request(4096)
    };
    let p = plan(&cost, &hw, &req).unwrap();
    assert_eq!(p.candidates.len(), 1);
    assert_eq!(
        p.require().unwrap().placement,
        Placement::Split {
            gpu: 0,
            gpu_layers: 10
        }
    );
    // Out of range, or without a GPU: refused by name.
    let too_many = PlanRequest {
        gpu_layers: Some(33),
        ..request(4096)
    };
    let e = plan(&cost, &hw, &too_many).unwrap_err().to_string();
    assert!(e.contains("33") && e.contains("32 layers"), "{e}");
    let e = plan(&cost, &machine(64 * GIB, &[]), &req).unwrap_err();
    assert!(matches!(e, PlanError::Unavailable(_)), "{e}");
    let e = plan(
        &cost,
        &machine(64 * GIB, &[]),
        &PlanRequest {
            backend: BackendChoice::Gpu,
            ..request(4096)
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("no usable Vulkan device"), "{e}");
}

#[test]
fn backend_cpu_keeps_the_model_off_the_gpu() {
    let req = PlanRequest {
        backend: BackendChoice::Cpu,
        ..request(4096)
    };
    let p = plan(&llama8b(), &machine(64 * GIB, &[80 * GIB]), &req).unwrap();
    assert_eq!(p.candidates.len(), 1);
    assert_eq!(p.require().unwrap().placement, Placement::Cpu);
}

#[test]
fn a_model_that_fits_nowhere_is_refused_with_the_numbers() {
    let cost = llama8b();
    let p = plan(&cost, &machine(2 * GIB, &[]), &request(4096)).unwrap();
    let e = p.require().unwrap_err().to_string();
    assert!(
        e.contains("fits on no device") && e.contains("cpu") && e.contains("2048.0 MiB free"),
        "{e}"
    );
    // The KV cache counts: 128k positions of f32 K and V over 32 layers of 8 × 128 is 32 GiB.
    let kv = cost.kv_cache_bytes(0..32, 131072, 1);
    assert_eq!(kv, 32 * 131072 * 2 * 1024 * 4);
    let p = plan(&cost, &machine(40 * GIB, &[]), &request(131072)).unwrap();
    let c = &p.candidates[0];
    assert!(!c.fits);
    assert_eq!(c.uses[0].kv, kv);
    assert!(c.uses[0].needed >= c.uses[0].weights + (HEADROOM * kv as f64) as u64);
    // At 4k positions the same machine holds it.
    assert!(plan(&cost, &machine(40 * GIB, &[]), &request(4096))
        .unwrap()
        .require()
        .is_ok());
}

#[test]
fn decode_reads_every_weight_once_and_prediction_is_the_roofline_when_memory_bound() {
    let cost = llama8b();
    // A CPU whose arithmetic is effectively free: decode is bandwidth over bytes read.
    let mut hw = machine(64 * GIB, &[]);
    hw.cpu.rates = rates(50e9, 1e9);
    hw.cpu.rates.product_latency = 0.0;
    hw.cpu.rates.op_latency = 0.0;
    hw.cpu.rates.elementwise = 1e-18;
    let p = plan(&cost, &hw, &request(4096)).unwrap();
    let pred = p.require().unwrap().prediction.clone().unwrap();
    let bytes = pred.decode_bytes_per_step.unwrap();
    let matrices: u64 = cost
        .tensors
        .iter()
        .filter(|t| t.is_matrix())
        .map(|t| t.bytes)
        .sum();
    assert!(
        (bytes - matrices as f64).abs() / bytes < 0.01,
        "{bytes} vs {matrices}"
    );
    let bound = 50e9 / bytes;
    let tps = pred.decode_tps.unwrap();
    assert!(tps < bound && tps > 0.95 * bound, "{tps} vs {bound}");
}
