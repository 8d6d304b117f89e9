//! What the planner counts for a checkpoint (`ModelFile::cost`) on the decoder fixtures
//! (`tests/fixtures/decoders`): the text model of a multimodal Gemma 3 costs what the same text
//! model alone does (its vision tower is not counted), and Gemma's tied output is not counted
//! twice.

use std::path::PathBuf;

use kiln_engine::plan::Place;
use kiln_engine::ModelFile;
use kiln_formats::LoadMode;

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family)
}

#[test]
fn a_multimodal_gemma3_costs_its_text_model() {
    let text = ModelFile::open(&fixture("gemma3"), LoadMode::Map)
        .unwrap()
        .cost()
        .unwrap();
    let mm = ModelFile::open(&fixture("gemma3-mm"), LoadMode::Map)
        .unwrap()
        .cost()
        .unwrap();
    assert!(text.tied_output && mm.tied_output);
    for place in [Place::Embedding, Place::Head]
        .into_iter()
        .chain((0..6).map(Place::Layer))
    {
        assert_eq!(text.bytes_at(place), mm.bytes_at(place), "{place:?}");
    }
    assert_eq!(text.total_bytes(), mm.total_bytes());
}

#[test]
fn windowed_layers_count_their_ring_only() {
    let cost = ModelFile::open(&fixture("gemma3"), LoadMode::Map)
        .unwrap()
        .cost()
        .unwrap();
    let c = cost.decoder().unwrap().clone();
    // One global layer of six, five with a window of 8: a ring of 8 - 1 + 512 rows (one prompt
    // piece), rounded up to ring blocks of 32, at long contexts; the whole context when short.
    let row = kiln_models::kv_row_bytes(&c, cost.kv_dtype) as u64;
    let ring = kiln_models::ring_rows(8, kiln_engine::PREFILL_CHUNK, 32768) as u64;
    assert_eq!(ring, 544);
    assert_eq!(
        cost.kv_cache_bytes(0..6, 32768, 2),
        2 * (32768 + 5 * ring) * row
    );
    assert_eq!(cost.kv_cache_bytes(0..6, 100, 1), 6 * 100 * row);
    assert_eq!(cost.kv_cache_bytes(1..2, 32768, 1), ring * row);
}
