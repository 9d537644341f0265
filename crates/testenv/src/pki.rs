//! Certificates and keys of a local control plane: one CA that signs the serving certificate and the admin
//! client certificate (`CN=admin, O=system:masters`), and the service-account signing key pair.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::Error;

/// PEM files written for kube-apiserver, plus the PEM texts the kubeconfig embeds.
#[derive(Debug)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub sa_public_key: PathBuf,
    pub sa_private_key: PathBuf,
    pub ca_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    /// The admin client certificate and key as files (kube-apiserver's client of the kubelets).
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    /// The CA's key (PEM), for the certificates of real nodes ([`Pki::sign`]).
    ca_key_pem: String,
}

impl Pki {
    /// Generates everything into `dir`; the serving certificate is for `localhost` and `127.0.0.1`.
    pub fn generate(dir: &Path) -> Result<Self, Error> {
        Self::generate_for(dir, &[])
    }

    /// Generates everything into `dir`; the serving certificate is also for `addresses`.
    pub fn generate_for(dir: &Path, addresses: &[String]) -> Result<Self, Error> {
        let pki_err = |e: rcgen::Error| Error::Pki(e.to_string());

        let ca_key = KeyPair::generate().map_err(pki_err)?;
        let ca_params = ca_params()?;
        let ca_cert = ca_params.self_signed(&ca_key).map_err(pki_err)?;
        let ca = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate().map_err(pki_err)?;
        let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        names.extend(addresses.iter().cloned());
        // The in-cluster names, for clients that reach the API server through the `kubernetes` Service.
        names.extend(["kubernetes", "kubernetes.default", "kubernetes.default.svc"].map(str::to_owned));
        names.push(crate::egress::SERVICE_CIDR.replace(".0/24", ".1"));
        let mut serving = CertificateParams::new(names).map_err(pki_err)?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &ca).map_err(pki_err)?;

        let admin_key = KeyPair::generate().map_err(pki_err)?;
        let mut admin = CertificateParams::new(Vec::<String>::new()).map_err(pki_err)?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &ca).map_err(pki_err)?;

        let sa_key = KeyPair::generate().map_err(pki_err)?;

        let write = |name: &str, contents: &str| -> Result<PathBuf, Error> {
            let path = dir.join(name);
            std::fs::write(&path, contents).map_err(|e| Error::io(&path, e))?;
            Ok(path)
        };
        Ok(Pki {
            ca_cert: write("ca.crt", &ca_cert.pem())?,
            serving_cert: write("serving.crt", &serving_cert.pem())?,
            serving_key: write("serving.key", &serving_key.serialize_pem())?,
            sa_public_key: write("sa.pub", &sa_key.public_key_pem())?,
            sa_private_key: write("sa.key", &sa_key.serialize_pem())?,
            admin_cert: write("admin.crt", &admin_cert.pem())?,
            admin_key: write("admin.key", &admin_key.serialize_pem())?,
            ca_pem: ca_cert.pem(),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            ca_key_pem: ca.key().serialize_pem(),
        })
    }

    /// Signs a certificate with this CA into `dir/<name>.crt` and `dir/<name>.key`: a client certificate
    /// (`CN=common_name, O=organization`) when `addresses` is empty, else a serving certificate for them.
    /// Returns the two paths.
    pub fn sign(
        &self,
        dir: &Path,
        name: &str,
        common_name: &str,
        organization: Option<&str>,
        addresses: &[String],
    ) -> Result<(PathBuf, PathBuf), Error> {
        let pki_err = |e: rcgen::Error| Error::Pki(e.to_string());
        let ca_key = KeyPair::from_pem(&self.ca_key_pem).map_err(pki_err)?;
        let ca = Issuer::new(ca_params()?, ca_key);
        let key = KeyPair::generate().map_err(pki_err)?;
        let mut params = CertificateParams::new(addresses.to_vec()).map_err(pki_err)?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        if let Some(organization) = organization {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization);
        }
        params.extended_key_usages = if addresses.is_empty() {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![ExtendedKeyUsagePurpose::ServerAuth]
        };
        let cert = params.signed_by(&key, &ca).map_err(pki_err)?;
        let write = |file: String, contents: String| -> Result<PathBuf, Error> {
            let path = dir.join(file);
            std::fs::write(&path, contents).map_err(|e| Error::io(&path, e))?;
            Ok(path)
        };
        Ok((
            write(format!("{name}.crt"), cert.pem())?,
            write(format!("{name}.key"), key.serialize_pem())?,
        ))
    }
}

/// The CA's certificate parameters: the same every time, so that [`Pki::sign`] issues under the CA it made.
fn ca_params() -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| Error::Pki(e.to_string()))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "cso-testenv-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Writes a fresh CA-signed serving certificate for `localhost` and `127.0.0.1` into `cert_dir` as
/// `tls.crt` and `tls.key` (the layout of cert-manager's Secrets) and returns the CA (PEM) that clients and
/// webhook configurations trust. The key is written first, so a server that reloads between the two writes
/// sees a mismatched pair and waits for its next check.
pub fn write_serving_certificate(cert_dir: &Path) -> Result<String, Error> {
    write_serving_certificate_for(cert_dir, &[])
}

/// [`write_serving_certificate`], the certificate also for `addresses` (a server reached from a network
/// namespace at the host's address there).
pub fn write_serving_certificate_for(cert_dir: &Path, addresses: &[String]) -> Result<String, Error> {
    let scratch = cert_dir.join(".pki");
    std::fs::create_dir_all(&scratch).map_err(|e| Error::io(&scratch, e))?;
    let pki = Pki::generate_for(&scratch, addresses)?;
    for (from, to) in [(&pki.serving_key, "tls.key"), (&pki.serving_cert, "tls.crt")] {
        let target = cert_dir.join(to);
        std::fs::copy(from, &target).map_err(|e| Error::io(&target, e))?;
    }
    Ok(pki.ca_pem)
}
