//! A content-addressed on-disk cache of assembled kernel specialisations,
//! for builds outside Bazel (Bazel caches actions itself).
//!
//! An entry lives in `<root>/kernels/<key>/` with `kernel.o`, `kernel.json`
//! and `digest` (blake3 of the two files). The key is blake3 of the
//! toolchain version, the target, the kernel name, the sorted parameters,
//! the include directories, and the bytes of the source and of every file it
//! includes. Which files a source includes is only known after assembling it
//! (it may depend on parameters), so `<root>/manifests/<base>.json` remembers
//! the include list of the last build for each (source, parameters, ...)
//! `base`; a lookup hashes the current contents of those files, and any
//! change to any of them changes the key. (A new file that would shadow an
//! include through the search path is not detected, as in ccache.)
//!
//! Invariants: entries are written into a temporary directory and renamed
//! into place, so a reader never sees a partial entry; every read verifies
//! the digest and parses both files, and a corrupt entry is rebuilt with a
//! warning. Logs "compiling kernel" and "kernel artifact created" (tracing,
//! INFO) like the existing stack.

use ipu_object::{KernelMetadata, Object, TOOLCHAIN_VERSION};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// What to build: one specialisation of one kernel source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    pub source: PathBuf,
    /// Kernel name (also the metadata's `kernel`).
    pub name: String,
    pub params: BTreeMap<String, i64>,
    pub include_dirs: Vec<PathBuf>,
    pub target: String,
}

impl KernelSpec {
    pub fn new(source: impl Into<PathBuf>, name: &str) -> Self {
        KernelSpec {
            source: source.into(),
            name: name.to_string(),
            params: BTreeMap::new(),
            include_dirs: Vec::new(),
            target: "ipu21".to_string(),
        }
    }

    pub fn param(mut self, name: &str, value: i64) -> Self {
        self.params.insert(name.to_string(), value);
        self
    }
}

/// A cached (or freshly built) kernel.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub key: String,
    pub object_path: PathBuf,
    pub metadata_path: PathBuf,
    pub object: Object,
    pub metadata: KernelMetadata,
    /// Whether the entry was found in the cache.
    pub cached: bool,
}

#[derive(Debug)]
pub enum CacheError {
    Io { path: PathBuf, message: String },
    Assemble(ipu_asm::AsmError),
    Invalid { path: PathBuf, message: String },
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            CacheError::Assemble(e) => write!(f, "{e}"),
            CacheError::Invalid { path, message } => write!(f, "{}: {message}", path.display()),
        }
    }
}

impl std::error::Error for CacheError {}

fn io(path: &Path) -> impl Fn(std::io::Error) -> CacheError + '_ {
    move |e| CacheError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    includes: Vec<PathBuf>,
}

/// The cache folder: `$XDG_CACHE_HOME/ipu-stack`, else `$HOME/.cache/ipu-stack`.
pub fn default_dir_from(
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    match xdg_cache_home.filter(|x| !x.is_empty()) {
        Some(x) => Some(PathBuf::from(x).join("ipu-stack")),
        None => home
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".cache").join("ipu-stack")),
    }
}

pub struct KernelCache {
    root: PathBuf,
}

impl KernelCache {
    /// Opens (creating) a cache rooted at `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<KernelCache, CacheError> {
        let root = dir.into();
        for sub in ["kernels", "manifests"] {
            let p = root.join(sub);
            std::fs::create_dir_all(&p).map_err(io(&p))?;
        }
        Ok(KernelCache { root })
    }

    /// Opens the user's cache folder (see [`default_dir_from`]).
    pub fn open_default() -> Result<KernelCache, CacheError> {
        let dir = default_dir_from(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
            .ok_or_else(|| CacheError::Invalid {
                path: PathBuf::from("~"),
                message: "neither XDG_CACHE_HOME nor HOME is set".into(),
            })?;
        Self::open(dir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Everything in the key except the included files' contents.
    fn base_key(spec: &KernelSpec, source: &[u8]) -> String {
        let mut h = blake3::Hasher::new();
        let mut field = |b: &[u8]| {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(b"ipu-kcache 1");
        field(TOOLCHAIN_VERSION.as_bytes());
        field(spec.target.as_bytes());
        field(spec.name.as_bytes());
        for (k, v) in &spec.params {
            field(k.as_bytes());
            field(&v.to_le_bytes());
        }
        for d in &spec.include_dirs {
            field(d.to_string_lossy().as_bytes());
        }
        field(source);
        h.finalize().to_hex().to_string()
    }

    fn full_key(base: &str, source_digest: &str) -> String {
        blake3::hash(format!("{base}\n{source_digest}").as_bytes())
            .to_hex()
            .to_string()
    }

    /// The key the manifest predicts, if its include list is still readable.
    fn predicted_key(&self, base: &str, source: &[u8]) -> Option<String> {
        let text =
            std::fs::read_to_string(self.root.join("manifests").join(format!("{base}.json")))
                .ok()?;
        let m: Manifest = serde_json::from_str(&text).ok()?;
        let mut files = vec![source.to_vec()];
        for p in &m.includes {
            files.push(std::fs::read(p).ok()?);
        }
        let refs: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        Some(Self::full_key(base, &ipu_asm::source_digest(&refs)))
    }

    /// Reads and verifies an entry; `Err` describes the corruption.
    fn read_entry(&self, key: &str) -> Result<Artifact, String> {
        let dir = self.root.join("kernels").join(key);
        let object_path = dir.join("kernel.o");
        let metadata_path = dir.join("kernel.json");
        let o = std::fs::read(&object_path).map_err(|e| format!("kernel.o: {e}"))?;
        let j = std::fs::read(&metadata_path).map_err(|e| format!("kernel.json: {e}"))?;
        let d = std::fs::read_to_string(dir.join("digest")).map_err(|e| format!("digest: {e}"))?;
        if d != digest_text(&o, &j) {
            return Err("digest does not match the files".into());
        }
        let object = Object::from_bytes(&o).map_err(|e| format!("kernel.o: {e}"))?;
        let text = String::from_utf8(j).map_err(|_| "kernel.json is not UTF-8".to_string())?;
        let metadata = KernelMetadata::from_json(&text).map_err(|e| format!("kernel.json: {e}"))?;
        Ok(Artifact {
            key: key.to_string(),
            object_path,
            metadata_path,
            object,
            metadata,
            cached: true,
        })
    }

    /// Returns the cached artifact for `spec`, assembling it on a miss.
    pub fn get_or_build(&self, spec: &KernelSpec) -> Result<Artifact, CacheError> {
        let source = std::fs::read(&spec.source).map_err(io(&spec.source))?;
        let base = Self::base_key(spec, &source);
        if let Some(key) = self.predicted_key(&base, &source) {
            let dir = self.root.join("kernels").join(&key);
            if dir.exists() {
                match self.read_entry(&key) {
                    Ok(a) => {
                        tracing::debug!(key = %key, name = %spec.name, "kernel cache hit");
                        return Ok(a);
                    }
                    Err(reason) => {
                        tracing::warn!(entry = %dir.display(), reason = %reason, "corrupt kernel cache entry; rebuilding");
                        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
                    }
                }
            }
        }
        tracing::info!(source = %spec.source.display(), name = %spec.name, target = %spec.target, "compiling kernel");
        let opts = ipu_asm::Options {
            defines: spec.params.clone(),
            include_dirs: spec.include_dirs.clone(),
            name: Some(spec.name.clone()),
            target: spec.target.clone(),
        };
        let out = ipu_asm::assemble_file(&spec.source, &opts).map_err(CacheError::Assemble)?;
        let key = Self::full_key(&base, &out.metadata.source_digest);
        let o = out.object.to_bytes().map_err(|e| CacheError::Invalid {
            path: spec.source.clone(),
            message: e.to_string(),
        })?;
        let j = out.metadata.to_json().into_bytes();
        let kernels = self.root.join("kernels");
        let dir = kernels.join(&key);
        if dir.exists() && self.read_entry(&key).is_err() {
            // An entry reached without a manifest (e.g. the manifest was
            // deleted) is only reused if it verifies.
            tracing::warn!(entry = %dir.display(), "corrupt kernel cache entry; rebuilding");
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        if !dir.exists() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let tmp = kernels.join(format!(".tmp-{key}-{}-{nanos}", std::process::id()));
            std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
            let write = |name: &str, bytes: &[u8]| {
                let p = tmp.join(name);
                std::fs::write(&p, bytes).map_err(io(&p))
            };
            write("kernel.o", &o)?;
            write("kernel.json", &j)?;
            write("digest", digest_text(&o, &j).as_bytes())?;
            if let Err(e) = std::fs::rename(&tmp, &dir) {
                let _ = std::fs::remove_dir_all(&tmp);
                // Another process may have created the same entry meanwhile;
                // only a verified entry counts.
                if self.read_entry(&key).is_err() {
                    return Err(io(&dir)(e));
                }
            }
        }
        let manifest = Manifest {
            includes: out.files[1..].to_vec(),
        };
        let mpath = self.root.join("manifests").join(format!("{base}.json"));
        let mtext = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
        ipu_object::write_atomic(&mpath, mtext.as_bytes()).map_err(io(&mpath))?;
        let mut a = self.read_entry(&key).map_err(|m| CacheError::Invalid {
            path: dir.clone(),
            message: m,
        })?;
        a.cached = false;
        tracing::info!(object = %a.object_path.display(), metadata = %a.metadata_path.display(), "kernel artifact created");
        Ok(a)
    }
}

fn digest_text(object: &[u8], metadata: &[u8]) -> String {
    format!(
        "kernel.o {}\nkernel.json {}\n",
        blake3::hash(object).to_hex(),
        blake3::hash(metadata).to_hex()
    )
}
