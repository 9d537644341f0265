//! Rendering: Helm charts through the `helm` binary ([`helm`]) and rendered YAML into objects ([`manifest`]).

pub mod helm;
pub mod manifest;

pub use helm::{ChartRenderer, Helm, RenderError, RenderRequest};
pub use manifest::{Manifest, ManifestError, parse_manifests};
