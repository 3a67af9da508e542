//! The TLS connector for each mode: rustls with the platform's roots, a
//! given CA, or (for `require`) no verification at all.

use std::path::PathBuf;
use std::sync::Arc;

use coord_core::{Error, Result};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::TlsMode;

/// Build the TLS connector for a mode (never used with `Disable`).
pub(crate) fn tls_connector(
    mode: TlsMode,
    root_cert: Option<&PathBuf>,
) -> Result<MakeRustlsConnect> {
    // ring's provider (deprecated by rustls 0.23.48 for its lack of
    // post-quantum key exchange; see coord-redis's TLS setup for why ring).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS setup failed: {e}")))?;
    let load_roots = |path: &PathBuf| -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
            Error::Config(format!("cannot read sslrootcert `{}`: {e}", path.display()))
        })?;
        for cert in certs {
            let cert = cert.map_err(|e| {
                Error::Config(format!(
                    "cannot parse sslrootcert `{}`: {e}",
                    path.display()
                ))
            })?;
            roots.add(cert).map_err(|e| {
                Error::Config(format!("bad certificate in `{}`: {e}", path.display()))
            })?;
        }
        if roots.is_empty() {
            return Err(Error::Config(format!(
                "sslrootcert `{}` holds no certificate",
                path.display()
            )));
        }
        Ok(roots)
    };
    let default_root =
        || std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql/root.crt"));
    let config = match (mode, root_cert) {
        (TlsMode::Disable | TlsMode::Prefer | TlsMode::Require, None) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth(),
        (TlsMode::VerifyFull, given) => {
            let path = given
                .cloned()
                .or_else(default_root)
                .ok_or_else(|| Error::Config("sslmode=verify-full needs sslrootcert".into()))?;
            builder
                .with_root_certificates(load_roots(&path)?)
                .with_no_client_auth()
        }
        (_, given) => {
            let path = given
                .cloned()
                .or_else(default_root)
                .ok_or_else(|| Error::Config("sslmode=verify-ca needs sslrootcert".into()))?;
            let inner =
                WebPkiServerVerifier::builder_with_provider(Arc::new(load_roots(&path)?), provider)
                    .build()
                    .map_err(|e| Error::Config(format!("TLS setup failed: {e}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(VerifyCa(inner)))
                .with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// libpq's `prefer`/`require` without a root certificate: encrypt, do not
/// authenticate the server. Signatures are still checked.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// libpq's `verify-ca`: the chain must lead to a trusted root; the host
/// name is not compared.
#[derive(Debug)]
struct VerifyCa(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for VerifyCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
