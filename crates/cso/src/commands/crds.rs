//! `cso crds`: the CRDs generated from the API types, as YAML on stdout.

pub fn print() -> anyhow::Result<()> {
    print!("{}", cso_api::crd::to_yaml()?);
    Ok(())
}
