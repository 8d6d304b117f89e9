//! The official JSON-Schema-Test-Suite, draft 2020-12, through the grammar compiler: every test
//! group's schema is compiled against Gemma 3's token table, and every instance of the group,
//! serialized compactly, is fed to it token by token (the table's longest-match tokenization).
//! The grammar accepts an instance when each token is allowed when it comes and the grammar may
//! end after the last.
//!
//! A false positive is an instance the suite marks invalid that the grammar accepts: constrained
//! decoding could then produce output that does not validate. llguidance does not enforce every
//! keyword (it documents what it approximates), so the suite has a baseline of false positives:
//! `json_schema_suite_baseline.txt` beside this file, one `file | group | test` a line. The test
//! fails on a false positive missing from the baseline, and on a baseline line that no longer
//! occurs (the baseline stays exact); after a deliberate change (a new llguidance), regenerate
//! it with
//!
//! ```text
//! KILN_UPDATE_BASELINE=1 cargo nextest run -p kiln-grammar --test json_schema_suite
//! ```
//!
//! and review the diff. False negatives (a valid instance refused) and schemas the compiler
//! refuses are counted and printed, not failed on: a request whose schema does not compile gets
//! an error, and a grammar stricter than its schema still produces valid output.
//!
//! The suite's files are committed under `tests/fixtures/json-schema-test-suite/` (the README
//! there says where they came from; `scripts/fetch-json-schema-test-suite` re-extracts them).
//! Groups that need documents from the suite's remote-reference server (`http://localhost:1234`)
//! are skipped, by name ([`SKIPPED_FILES`], [`SKIPPED_GROUPS`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use kiln_grammar::{GrammarSpec, TokenTable};
use kiln_testdata::gemma_model_path;
use serde_json::Value;

/// Files skipped whole: every group in them references the remote server.
const SKIPPED_FILES: &[&str] = &["refRemote.json"];

/// Groups skipped, by file and description: their schemas `$ref` (or name as `$schema`) a
/// document served by the remote server.
const SKIPPED_GROUPS: &[(&str, &str)] = &[
    (
        "dynamicRef.json",
        "strict-tree schema, guards against misspelled properties",
    ),
    (
        "dynamicRef.json",
        "tests for implementation dynamic anchor and reference link",
    ),
    (
        "dynamicRef.json",
        "$ref and $dynamicAnchor are independent of order - $defs first",
    ),
    (
        "dynamicRef.json",
        "$ref and $dynamicAnchor are independent of order - $ref first",
    ),
    (
        "dynamicRef.json",
        "$ref to $dynamicRef finds detached $dynamicAnchor",
    ),
    (
        "vocabulary.json",
        "schema that uses custom metaschema with with no validation vocabulary",
    ),
    ("vocabulary.json", "ignore unrecognized optional vocabulary"),
];

const BASELINE_HEADER: &str = "\
# False positives of kiln's JSON-schema grammars (llguidance) on the JSON-Schema-Test-Suite,
# draft 2020-12: instances the suite marks invalid that the compiled grammar accepts, as
# `file | group description | test description`, sorted. crates/kiln-grammar/tests/
# json_schema_suite.rs fails on any false positive not listed here and on any line here that no
# longer occurs. Regenerate (and review the diff) with
#   KILN_UPDATE_BASELINE=1 cargo nextest run -p kiln-grammar --test json_schema_suite
";

fn suite_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/json-schema-test-suite/draft2020-12")
}

fn baseline_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/json_schema_suite_baseline.txt")
}

/// Gemma 3's token table, padded as in `vocabs.rs`.
fn gemma_table() -> TokenTable {
    let path = gemma_model_path();
    let file = kiln_formats::GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let tokenizer = kiln_tokenizer::Tokenizer::from_gguf(&file).unwrap();
    TokenTable::new(&tokenizer, tokenizer.vocab_size() + 64).unwrap()
}

/// Whether `spec` takes `text`'s tokens one by one (each allowed when it comes) and may end
/// after them.
fn accepts(table: &TokenTable, spec: &GrammarSpec, text: &str) -> bool {
    let Ok(mut c) = table.start(spec) else {
        return false;
    };
    for id in table.greedy_tokenize(text.as_bytes()) {
        match c.allowed() {
            Ok(mask) if mask.allows(id) => {
                if c.commit(id).is_err() {
                    return false;
                }
            }
            _ => return false,
        }
    }
    c.is_done() || c.is_accepting()
}

/// What happened to the cases of one file.
#[derive(Default)]
struct Tally {
    groups: usize,
    refused_schemas: usize,
    /// Instances of groups whose schema did not compile.
    uncompiled: usize,
    true_accepts: usize,
    true_rejects: usize,
    false_negatives: usize,
    false_positives: usize,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.groups += o.groups;
        self.refused_schemas += o.refused_schemas;
        self.uncompiled += o.uncompiled;
        self.true_accepts += o.true_accepts;
        self.true_rejects += o.true_rejects;
        self.false_negatives += o.false_negatives;
        self.false_positives += o.false_positives;
    }

    fn instances(&self) -> usize {
        self.uncompiled
            + self.true_accepts
            + self.true_rejects
            + self.false_negatives
            + self.false_positives
    }
}

#[test]
fn json_schema_test_suite_draft2020_12_has_no_false_positive_beyond_the_baseline() {
    let t0 = Instant::now();
    let table = gemma_table();
    let table_s = t0.elapsed().as_secs_f64();

    let mut files: Vec<PathBuf> = std::fs::read_dir(suite_dir())
        .unwrap_or_else(|e| panic!("{}: {e}", suite_dir().display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 40, "only {} suite files", files.len());

    let mut per_file: BTreeMap<String, Tally> = BTreeMap::new();
    let mut false_positives = BTreeSet::new();
    let mut false_negatives = Vec::new();
    let mut compile_errors = Vec::new();
    let mut seen = BTreeSet::new();
    let mut skipped_groups = BTreeSet::new();
    let mut skipped_instances = 0;
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let groups: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let tally = per_file.entry(file.clone()).or_default();
        for group in &groups {
            let desc = group["description"].as_str().unwrap();
            let tests = group["tests"].as_array().unwrap();
            if SKIPPED_FILES.contains(&file.as_str())
                || SKIPPED_GROUPS.contains(&(file.as_str(), desc))
            {
                skipped_groups.insert((file.clone(), desc.to_string()));
                skipped_instances += tests.len();
                continue;
            }
            tally.groups += 1;
            let spec = GrammarSpec::JsonSchema(group["schema"].clone());
            let compiled = table.start(&spec);
            if let Err(e) = &compiled {
                tally.refused_schemas += 1;
                tally.uncompiled += tests.len();
                compile_errors.push(format!("{file} | {desc}: {e}"));
            }
            for test in tests {
                let key = format!(
                    "{file} | {desc} | {}",
                    test["description"].as_str().unwrap()
                );
                assert!(seen.insert(key.clone()), "two cases named {key}");
                if compiled.is_err() {
                    continue;
                }
                let valid = test["valid"].as_bool().unwrap();
                let text = serde_json::to_string(&test["data"]).unwrap();
                match (valid, accepts(&table, &spec, &text)) {
                    (true, true) => tally.true_accepts += 1,
                    (false, false) => tally.true_rejects += 1,
                    (true, false) => {
                        tally.false_negatives += 1;
                        false_negatives.push(format!("{key}: {text}"));
                    }
                    (false, true) => {
                        tally.false_positives += 1;
                        false_positives.insert(key);
                    }
                }
            }
        }
    }

    // Every skip names something that is there (a renamed group is not skipped silently).
    for f in SKIPPED_FILES {
        assert!(
            per_file.contains_key(*f),
            "skipped file {f} is not in the suite"
        );
    }
    for (f, g) in SKIPPED_GROUPS {
        assert!(
            skipped_groups.contains(&(f.to_string(), g.to_string())),
            "skipped group {f} | {g} is not in the suite"
        );
    }

    let mut total = Tally::default();
    eprintln!(
        "{:<32} {:>6} {:>8} {:>6} {:>6} {:>6} {:>6}",
        "file", "groups", "refused", "ok+", "ok-", "FN", "FP"
    );
    for (file, t) in &per_file {
        total.add(t);
        if t.groups == 0 {
            continue;
        }
        eprintln!(
            "{file:<32} {:>6} {:>8} {:>6} {:>6} {:>6} {:>6}",
            t.groups,
            t.refused_schemas,
            t.true_accepts,
            t.true_rejects,
            t.false_negatives,
            t.false_positives
        );
    }
    eprintln!("\nschemas the compiler refused:");
    for e in &compile_errors {
        eprintln!("  {e}");
    }
    eprintln!("\nfalse negatives (valid instances refused):");
    for e in &false_negatives {
        eprintln!("  {e}");
    }
    eprintln!("\nfalse positives (invalid instances accepted):");
    for e in &false_positives {
        eprintln!("  {e}");
    }

    let baseline_text = std::fs::read_to_string(baseline_path()).unwrap_or_default();
    let baseline: BTreeSet<String> = baseline_text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let new: Vec<&String> = false_positives.difference(&baseline).collect();
    let gone: Vec<&String> = baseline.difference(&false_positives).collect();

    eprintln!(
        "\nJSON-Schema-Test-Suite draft 2020-12: {} groups ({} skipped: remote refs), {} instances \
         ({} skipped); {} schemas refused by the compiler ({} instances); {} true accepts, {} true \
         rejects, {} false negatives, {} false positives ({} in the baseline); table {table_s:.1} s, \
         total {:.1} s",
        total.groups,
        skipped_groups.len(),
        total.instances(),
        skipped_instances,
        total.refused_schemas,
        total.uncompiled,
        total.true_accepts,
        total.true_rejects,
        total.false_negatives,
        total.false_positives,
        false_positives.len() - new.len(),
        t0.elapsed().as_secs_f64()
    );

    if std::env::var_os("KILN_UPDATE_BASELINE").is_some() {
        let mut out = BASELINE_HEADER.to_string();
        for fp in &false_positives {
            out.push_str(fp);
            out.push('\n');
        }
        std::fs::write(baseline_path(), out).unwrap();
        eprintln!(
            "wrote {} false positives to {}",
            false_positives.len(),
            baseline_path().display()
        );
        return;
    }
    let update = "if the change is intended (a new llguidance, a changed schema translation), \
                  regenerate the baseline with `KILN_UPDATE_BASELINE=1 cargo nextest run -p \
                  kiln-grammar --test json_schema_suite` and review its diff";
    let list = |v: &[&String]| -> String { v.iter().map(|s| format!("\n  {s}")).collect() };
    assert!(
        new.is_empty() && gone.is_empty(),
        "the false positives differ from {}:\n{} new (invalid instances now accepted):{}\n{} gone \
         (no longer accepted):{}\n{update}",
        baseline_path().display(),
        new.len(),
        list(&new),
        gone.len(),
        list(&gone),
    );
}
