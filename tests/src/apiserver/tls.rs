//! TLS on the server's port: a CA and a serving certificate for the
//! listen address, made at start. kubectl (client-go) sends credentials
//! only over TLS, so the server speaks TLS when a client starts with a
//! TLS handshake and plain HTTP otherwise, on the same port.

use std::{net::Ipv4Addr, sync::Arc};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

/// The server's TLS setup.
pub struct Tls {
    /// Accepts TLS connections with the serving certificate.
    pub acceptor: TlsAcceptor,
    /// The CA certificate (PEM) clients trust.
    pub ca_pem: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// A fresh CA and a certificate for `ip` (and `localhost`) signed by it.
    pub fn new(ip: Ipv4Addr) -> Result<Self, String> {
        let err = |e: rcgen::Error| format!("making the API server's certificates: {e}");
        let ca_key = KeyPair::generate().map_err(err)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "rivet-test-apiserver-ca");
        let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
        let key = KeyPair::generate().map_err(err)?;
        let mut leaf =
            CertificateParams::new(vec![ip.to_string(), "localhost".to_string()]).map_err(err)?;
        leaf.distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let cert = leaf.signed_by(&key, &ca_cert, &ca_key).map_err(err)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            ca_pem: ca_cert.pem(),
        })
    }
}
