//! Compares every traced intermediate of a decoder's forward pass on the CPU backend and on a
//! Vulkan device: `cargo run -p kiln-cli --example trace_compare -- MODEL [N_TOKENS]`.

use std::sync::Mutex;

use kiln_backend::Backend;
use kiln_cpu::{CpuBackend, CpuOptions};
use kiln_engine::ModelFile;
use kiln_formats::LoadMode;
use kiln_models::Trace;
use kiln_vulkan::{VulkanBackend, VulkanOptions};

#[derive(Default)]
struct Record(Mutex<Vec<(String, usize, Vec<f32>)>>);

impl<B: Backend> Trace<B> for Record {
    fn trace(&self, b: &B, name: &str, layer: usize, x: &B::Tensor) {
        let v = b.to_f32(x).unwrap();
        self.0.lock().unwrap().push((name.to_string(), layer, v));
    }
}

fn run<B: Backend>(b: &B, file: &mut ModelFile, ids: &[u32]) -> Vec<(String, usize, Vec<f32>)> {
    let model = file.load_decoder(b).unwrap();
    let mut cache = model.new_cache(b, 64).unwrap();
    let rec = Record::default();
    let h = model.forward_traced(b, ids, &mut cache, &rec).unwrap();
    let logits = model.logits(b, &h).unwrap();
    let mut out = rec.0.into_inner().unwrap();
    out.push(("logits".into(), 0, b.to_f32(&logits).unwrap()));
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = kiln_hub::Hub::from_env().resolve(&args[1]).unwrap();
    let n: usize = args.get(2).map_or(8, |s| s.parse().unwrap());
    let ids: Vec<u32> = (0..n as u32).map(|i| 2 + i * 977 % 5000).collect();
    let mut file = ModelFile::open(&path, LoadMode::Map).unwrap();
    let cpu = run(
        &CpuBackend::with_options(&CpuOptions::threads(2)).unwrap(),
        &mut file,
        &ids,
    );
    let vk = run(
        &VulkanBackend::new(&VulkanOptions::default()).unwrap(),
        &mut file,
        &ids,
    );
    for ((name, layer, a), (_, _, b)) in cpu.iter().zip(&vk) {
        let (mut worst, mut at, mut mag) = (0f32, 0, 0f32);
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            mag = mag.max(x.abs());
            if (x - y).abs() > worst || y.is_nan() {
                worst = if y.is_nan() { f32::NAN } else { (x - y).abs() };
                at = i;
            }
        }
        println!("{layer:2} {name:10} max|x| {mag:10.3} max|Δ| {worst:10.4} at {at}");
        if name == "logits" {
            let cols = a.len() / ids.len();
            for r in 0..ids.len() {
                let bad: Vec<usize> = (0..cols)
                    .filter(|&c| (a[r * cols + c] - b[r * cols + c]).abs() > 1.0)
                    .collect();
                println!(
                    "row {r}: {} columns off by > 1, first {:?} last {:?}; vk {:?} cpu {:?}",
                    bad.len(),
                    bad.first(),
                    bad.last(),
                    bad.first().map(|&c| b[r * cols + c]),
                    bad.first().map(|&c| a[r * cols + c])
                );
            }
        }
    }
}
