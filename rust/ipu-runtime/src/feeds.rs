//! Host tensors for a package's calls: `.npy` files by name, or generated
//! (seeded Gaussian, or the seed log's constant check).

use std::collections::BTreeMap;
use std::path::PathBuf;

use ipu_graph::{Graph, TensorType};
use ipu_package::Package;
use ipu_reference::random::{self, Fill};
use ipu_reference::Tensor;

use crate::RuntimeError;

/// How to generate the tensors that no file supplies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Generate {
    /// Inputs N(0, 1); weights N(0, 1/fan_in); vectors N(0, 0.25)
    /// (`ipu_reference::random::gaussian_feeds`), from this seed.
    Gaussian {
        /// Seed; each tensor's stream depends on the seed and its name only.
        seed: u64,
    },
    /// Inputs all ones; weights all 1/fan_in; vectors zero
    /// (`ipu_reference::random::constant_feeds`).
    Constant,
    /// Every element `value`.
    Fill {
        /// The value (rounded to the dtype).
        value: f64,
    },
    /// Nothing is generated: every tensor must come from a file.
    None,
}

/// Where call inputs come from.
#[derive(Clone, Debug, PartialEq)]
pub struct FeedSpec {
    /// `.npy` files by tensor name (take precedence).
    pub files: BTreeMap<String, PathBuf>,
    /// For the rest.
    pub generate: Generate,
}

impl Default for FeedSpec {
    fn default() -> Self {
        FeedSpec {
            files: BTreeMap::new(),
            generate: Generate::Gaussian { seed: 0 },
        }
    }
}

/// Tensors for every input of every call of `package` (names are unique
/// across calls in practice: parameters in `initialize`, inputs in `run`).
/// With a graph, generation follows the graph's roles (input or param) so
/// the reference sees the same tensors; without one, inputs of
/// `initialize` count as parameters.
pub fn make_feeds(
    package: &Package,
    graph: Option<&Graph>,
    spec: &FeedSpec,
) -> Result<BTreeMap<String, Tensor>, RuntimeError> {
    let by_graph: BTreeMap<String, Tensor> = match (graph, spec.generate) {
        (Some(g), Generate::Gaussian { seed }) => random::gaussian_feeds(g, seed),
        (Some(g), Generate::Constant) => random::constant_feeds(g),
        _ => BTreeMap::new(),
    };
    let mut feeds = BTreeMap::new();
    for call in &package.info.calls {
        for t in &call.inputs {
            let ty = TensorType::new(t.dtype, t.shape.clone());
            let tensor = if let Some(path) = spec.files.get(&t.name) {
                ipu_reference::npy::read_file(path, &ty).map_err(|e| {
                    RuntimeError::Feed(format!(
                        "call `{}` input `{}` ({ty}): {e}",
                        call.name, t.name
                    ))
                })?
            } else if let Some(g) = by_graph.get(&t.name).filter(|g| g.ty() == ty) {
                g.clone()
            } else {
                let param = call.name == "initialize";
                let dims = ty.shape.dims();
                let fan_in = (dims.len() >= 2).then(|| dims[dims.len() - 2] as f64);
                let fill = match spec.generate {
                    Generate::Gaussian { .. } => Fill::Gaussian {
                        mean: 0.0,
                        std: match (param, fan_in) {
                            (false, _) => 1.0,
                            (true, Some(k)) => 1.0 / k.sqrt(),
                            (true, None) => 0.5,
                        },
                    },
                    Generate::Constant => Fill::Constant(match (param, fan_in) {
                        (false, _) => 1.0,
                        (true, Some(k)) => 1.0 / k,
                        (true, None) => 0.0,
                    }),
                    Generate::Fill { value } => Fill::Constant(value),
                    Generate::None => {
                        return Err(RuntimeError::Feed(format!(
                            "call `{}` input `{}` ({ty}): no .npy file given and generation is off",
                            call.name, t.name
                        )))
                    }
                };
                let seed = match spec.generate {
                    Generate::Gaussian { seed } => seed,
                    _ => 0,
                };
                random::generate(&ty, fill, random::seed_for(seed, &t.name))
            };
            feeds.insert(t.name.clone(), tensor);
        }
    }
    Ok(feeds)
}

/// The tensors of `feeds` that call `name` takes.
pub fn for_call(
    package: &Package,
    name: &str,
    feeds: &BTreeMap<String, Tensor>,
) -> BTreeMap<String, Tensor> {
    package
        .info
        .calls
        .iter()
        .filter(|c| c.name == name)
        .flat_map(|c| &c.inputs)
        .filter_map(|t| feeds.get(&t.name).map(|x| (t.name.clone(), x.clone())))
        .collect()
}
