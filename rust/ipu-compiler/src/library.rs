//! The kernel library: where assembled kernel objects come from.
//!
//! Two sources, one interface ([`KernelLibrary::get`]):
//! - a Bazel kernel library index (`<name>.library.json`, written by the
//!   `ipu_kernel_library` rule): `{"kernels": [{"name", "arch", "source",
//!   "object", "metadata", "params"}]}` with paths relative to the execution
//!   root (the working directory of the compile action), or else relative to
//!   the index's own directory;
//! - the kernel sources in a `device/` directory, assembled on demand through
//!   the content-addressed kernel cache of `ipu-kcache` (builds outside Bazel).
//!
//! A request names the kernel's entry symbol and the parameters it needs. An
//! object matches when its metadata lists the entry and records every
//! requested parameter with the requested value. Requests are recorded, so the
//! report can name every specialisation the package used. A loaded object's
//! global symbols are renamed with its parameters ([`KernelRequest::symbol`])
//! so that several specialisations of one source link into one tile.

use crate::error::CompileError;
use ipu_object::{KernelMetadata, Object};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where kernels come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// A Bazel `*.library.json` index.
    Index(PathBuf),
    /// Kernel sources (`device/`), assembled through the kernel cache in
    /// `cache_dir` (the user's default cache when `None`).
    Sources {
        device_dir: PathBuf,
        cache_dir: Option<PathBuf>,
    },
}

/// One kernel specialisation a vertex needs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelRequest {
    /// The entry symbol, e.g. `gemm_f16`.
    pub entry: String,
    /// The source file in `device/` that defines it.
    pub source: String,
    /// Parameters the object must have been assembled with.
    pub params: BTreeMap<String, i64>,
}

impl KernelRequest {
    /// The linked name of the entry: the entry with the parameters appended
    /// (`reduce_f32__EPI2__OUT16`), so that two specialisations of one
    /// source can be linked into the same tile.
    pub fn symbol(&self) -> String {
        mangle(&self.entry, &self.params)
    }
}

fn mangle(name: &str, params: &BTreeMap<String, i64>) -> String {
    let mut s = name.to_string();
    for (k, v) in params {
        s.push_str(&format!(
            "__{k}{}",
            if *v < 0 {
                format!("m{}", -v)
            } else {
                v.to_string()
            }
        ));
    }
    s
}

/// Renames every global symbol the object defines to its mangled name.
fn rename_globals(object: &mut Object, params: &BTreeMap<String, i64>) {
    for sym in &mut object.symbols {
        if sym.binding == ipu_object::Binding::Global && sym.section.is_some() {
            sym.name = mangle(&sym.name, params);
        }
    }
}

impl std::fmt::Display for KernelRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.entry)?;
        for (k, v) in &self.params {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

/// A kernel object ready to link.
#[derive(Clone, Debug)]
pub struct LoadedKernel {
    pub request: KernelRequest,
    pub object: Object,
    pub metadata: KernelMetadata,
    /// Where the object came from, for messages and the report: the index's
    /// object path, or `kernel cache:<key>/kernel.o` (the entry under the
    /// cache's root, which differs between machines).
    pub origin: String,
}

#[derive(Deserialize)]
struct IndexFile {
    kernels: Vec<IndexEntry>,
}

#[derive(Deserialize)]
struct IndexEntry {
    name: String,
    #[serde(default)]
    arch: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    source: Option<String>,
    object: String,
    metadata: String,
    #[serde(default)]
    #[allow(dead_code)]
    params: serde_json::Value,
}

/// Kernel objects by request; see the module documentation.
#[derive(Clone)]
pub struct KernelLibrary {
    source: KernelSource,
    /// Index entries with their metadata (index sources only).
    index: Vec<(String, PathBuf, KernelMetadata)>,
    loaded: BTreeMap<KernelRequest, LoadedKernel>,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> CompileError {
    CompileError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

impl KernelLibrary {
    /// Opens a library; an index is read and every entry's metadata parsed now,
    /// so that a broken index fails before planning starts.
    pub fn open(source: &KernelSource) -> Result<KernelLibrary, CompileError> {
        let mut index = Vec::new();
        if let KernelSource::Index(path) = source {
            let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
            let file: IndexFile =
                serde_json::from_str(&text).map_err(|e| CompileError::KernelLibrary {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            let base = path.parent().unwrap_or(Path::new("."));
            for (i, e) in file.kernels.iter().enumerate() {
                if e.arch.as_deref().is_some_and(|a| a != "ipu21") {
                    continue;
                }
                let meta_path = resolve(base, &e.metadata);
                let meta_text = std::fs::read_to_string(&meta_path).map_err(|err| {
                    CompileError::KernelLibrary {
                        path: path.clone(),
                        message: format!(
                            "kernel {i} (`{}`): metadata {}: {err}",
                            e.name,
                            meta_path.display()
                        ),
                    }
                })?;
                let meta = KernelMetadata::from_json(&meta_text).map_err(|err| {
                    CompileError::KernelLibrary {
                        path: path.clone(),
                        message: format!(
                            "kernel {i} (`{}`): metadata {}: {err}",
                            e.name,
                            meta_path.display()
                        ),
                    }
                })?;
                index.push((e.name.clone(), resolve(base, &e.object), meta));
            }
        }
        Ok(KernelLibrary {
            source: source.clone(),
            index,
            loaded: BTreeMap::new(),
        })
    }

    /// The object for `request`, loading or assembling it on first use.
    pub fn get(&mut self, request: &KernelRequest) -> Result<&LoadedKernel, CompileError> {
        if !self.loaded.contains_key(request) {
            let k = self.load(request)?;
            self.loaded.insert(request.clone(), k);
        }
        Ok(&self.loaded[request])
    }

    /// A library that loads on its own from the same source, with what this
    /// one has loaded so far: a segment planned on another thread uses one,
    /// and [`KernelLibrary::absorb`] takes back what it loaded.
    pub fn fork(&self) -> KernelLibrary {
        self.clone()
    }

    /// Adds the kernels `fork` loaded. Loading is a function of the
    /// request, so a request both loaded gives the same object, and the
    /// merged set does not depend on the order in which forks come back.
    pub fn absorb(&mut self, fork: KernelLibrary) {
        for (request, kernel) in fork.loaded {
            self.loaded.entry(request).or_insert(kernel);
        }
    }

    /// A kernel already loaded by [`KernelLibrary::get`] (for readers that
    /// share the library across threads).
    pub fn loaded(&self, request: &KernelRequest) -> Option<&LoadedKernel> {
        self.loaded.get(request)
    }

    /// Every kernel loaded so far, in request order.
    pub fn used(&self) -> impl Iterator<Item = &LoadedKernel> {
        self.loaded.values()
    }

    fn load(&self, request: &KernelRequest) -> Result<LoadedKernel, CompileError> {
        let mut k = self.load_object(request)?;
        rename_globals(&mut k.object, &request.params);
        Ok(k)
    }

    fn load_object(&self, request: &KernelRequest) -> Result<LoadedKernel, CompileError> {
        match &self.source {
            KernelSource::Index(path) => {
                let mut matches = self.index.iter().filter(|(_, _, m)| {
                    m.entries.contains(&request.entry)
                        && request
                            .params
                            .iter()
                            .all(|(k, v)| m.parameters.get(k) == Some(v))
                });
                let found = matches.next();
                // Two objects that both record every requested parameter
                // differ in one the request leaves to chance: an error, not
                // whichever the index lists first.
                if let (Some(first), Some(second)) = (found, matches.next()) {
                    return Err(CompileError::KernelLibrary {
                        path: path.clone(),
                        message: format!(
                            "kernel request {request} matches several objects ({} {:?} and {} {:?}); the request must name the parameter that tells them apart",
                            first.0, first.2.parameters, second.0, second.2.parameters
                        ),
                    });
                }
                let Some((name, object_path, meta)) = found else {
                    return Err(CompileError::MissingKernel {
                        kernel: request.to_string(),
                        searched: format!(
                            "{} ({} kernels: {})",
                            path.display(),
                            self.index.len(),
                            self.index
                                .iter()
                                .map(|(n, _, m)| format!("{n} {:?}", m.parameters))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                };
                let bytes =
                    std::fs::read(object_path).map_err(|e| CompileError::KernelLibrary {
                        path: path.clone(),
                        message: format!("kernel `{name}`: object {}: {e}", object_path.display()),
                    })?;
                let object =
                    Object::from_bytes(&bytes).map_err(|e| CompileError::KernelLibrary {
                        path: path.clone(),
                        message: format!("kernel `{name}`: object {}: {e}", object_path.display()),
                    })?;
                Ok(LoadedKernel {
                    request: request.clone(),
                    object,
                    metadata: meta.clone(),
                    origin: object_path.display().to_string(),
                })
            }
            KernelSource::Sources {
                device_dir,
                cache_dir,
            } => {
                let cache = match cache_dir {
                    Some(d) => ipu_kcache::KernelCache::open(d),
                    None => ipu_kcache::KernelCache::open_default(),
                }
                .map_err(|e| CompileError::KernelLibrary {
                    path: cache_dir.clone().unwrap_or_default(),
                    message: e.to_string(),
                })?;
                let mut spec =
                    ipu_kcache::KernelSpec::new(device_dir.join(&request.source), &request.entry);
                // A missing source most often means a relative --device-dir
                // (default `device`) read from another working directory.
                let source = device_dir.join(&request.source);
                if !source.is_file() {
                    return Err(CompileError::KernelLibrary {
                        path: source,
                        message: format!(
                            "kernel source of {request} not found: kernels are assembled from the kernel source directory {} ({}); pass --device-dir with the repository's device/ directory, or --kernel-library with a Bazel kernel library index",
                            device_dir.display(),
                            match std::env::current_dir() {
                                Ok(cwd) if device_dir.is_relative() => format!("relative to the working directory {}", cwd.display()),
                                _ => "as given".to_string(),
                            }
                        ),
                    });
                }
                spec.include_dirs.push(device_dir.clone());
                for (k, v) in &request.params {
                    spec = spec.param(k, *v);
                }
                let artifact =
                    cache
                        .get_or_build(&spec)
                        .map_err(|e| CompileError::KernelLibrary {
                            path: device_dir.join(&request.source),
                            message: e.to_string(),
                        })?;
                // The assembler takes any -D as a constant, so a request
                // naming a parameter the source does not declare (.param)
                // would silently get the default code: it is missing, as
                // it would be from an index.
                if !artifact.metadata.entries.contains(&request.entry)
                    || request
                        .params
                        .iter()
                        .any(|(k, v)| artifact.metadata.parameters.get(k) != Some(v))
                {
                    return Err(CompileError::MissingKernel {
                        kernel: request.to_string(),
                        searched: device_dir.join(&request.source).display().to_string(),
                    });
                }
                // The cache's root differs between machines and users, its
                // entries' keys (digests of the source, includes and
                // parameters) do not; the origin goes into the package's
                // report, which must be the same bytes anywhere.
                let origin = match artifact.object_path.strip_prefix(cache.root()) {
                    Ok(entry) => format!("kernel cache:{}", entry.display()),
                    Err(_) => artifact.object_path.display().to_string(),
                };
                Ok(LoadedKernel {
                    request: request.clone(),
                    object: artifact.object,
                    metadata: artifact.metadata,
                    origin,
                })
            }
        }
    }
}

/// An index path: as given when it exists relative to the working directory
/// (Bazel's execution root), else relative to the index's directory.
fn resolve(base: &Path, p: &str) -> PathBuf {
    let direct = PathBuf::from(p);
    if direct.is_absolute() || direct.exists() {
        direct
    } else {
        base.join(p)
    }
}
