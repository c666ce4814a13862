//! Phase `load`: read, parse and verify the model (what can be lowered is
//! decided later: `legalize` rewrites it into the device graph, and `fuse`
//! refuses what no lowering takes).

use crate::error::CompileError;
use ipu_graph::Graph;
use std::path::Path;

/// A loaded model: the verified graph and its canonical text (the package's
/// `model.ipug` member).
pub struct Model {
    pub graph: Graph,
    pub text: String,
    /// The model's `repeat` blocks, as the parser expanded them into
    /// `graph` ([`crate::loops`] may compile one as a device loop).
    pub repeats: Vec<ipu_graph::Repeat>,
}

pub fn load(path: &Path) -> Result<Model, CompileError> {
    let (graph, repeats) = ipu_graph::parse_file_with_repeats(path)
        .map_err(|message| CompileError::Model { message })?;
    if let Err(errors) = ipu_graph::verify(&graph) {
        let message = errors
            .iter()
            .map(|e| format!("{}: {e}", path.display()))
            .collect::<Vec<_>>()
            .join("\n");
        return Err(CompileError::Model { message });
    }
    let text = ipu_graph::print(&graph);
    Ok(Model {
        graph,
        text,
        repeats,
    })
}
