//! Rendering: Helm charts through the `helm` binary ([`helm`]) or through one long-lived process on Helm's
//! engine ([`engine`]), values templating over the Cluster
//! ([`values`]), and rendered YAML into objects ([`manifest`]).

pub mod cache;
pub mod engine;
pub mod helm;
pub mod manifest;
pub mod values;

pub use cache::CachingRenderer;
pub use engine::Engine;
pub use helm::{ChartRenderer, Helm, RenderError, RenderRequest};
pub use manifest::{Manifest, ManifestError, parse_manifests};
pub use values::{ValuesError, ValuesTemplater};
