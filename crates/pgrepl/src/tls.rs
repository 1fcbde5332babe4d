//! rustls client configuration implementing libpq's ssl modes, and the
//! `tls-server-end-point` channel-binding hash (RFC 5929) for SCRAM-SHA-256-PLUS.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use sha2::Digest;

use crate::config::{ConnectConfig, SslMode};
use crate::error::ReplError;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the client config for `cfg.ssl_mode` (which must not be `Disable`), with
/// libpq 16+'s rules: a root file makes `prefer` and `require` verify the chain as
/// `verify-ca` does; `verify-ca` needs a root file; the system's trust store serves only
/// `verify-full`, where the host name is checked too.
pub(crate) fn client_config(cfg: &ConnectConfig) -> Result<Arc<ClientConfig>, ReplError> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match (cfg.ssl_mode, &cfg.ssl_root_cert) {
        (SslMode::Disable | SslMode::Prefer | SslMode::Require, None) => {
            Arc::new(NoVerification(Arc::clone(&provider)))
        }
        (SslMode::Disable | SslMode::Prefer | SslMode::Require | SslMode::VerifyCa, Some(_)) => {
            Arc::new(WebPki {
                inner: webpki_verifier(cfg, &provider)?,
                names: NameCheck::Ignored,
            })
        }
        (SslMode::VerifyCa, None) => {
            return Err(ReplError::Config(
                "sslmode=verify-ca needs a root certificate file: set PGSSLROOTCERT (or create ~/.postgresql/root.crt) with the CA that signed the server certificate; the system trust store is used only with sslmode=verify-full, which also checks the host name".into(),
            ))
        }
        (SslMode::VerifyFull, _) => Arc::new(WebPki {
            inner: webpki_verifier(cfg, &provider)?,
            names: NameCheck::HostOrCommonName,
        }),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ReplError::Tls(format!("building TLS config: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &cfg.ssl_client_cert {
        Some((cert, key)) => {
            let (chain, key) = client_identity(cert, key)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                ReplError::Config(format!("client certificate {}: {e}", cert.display()))
            })?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The name presented for SNI and, in verify-full, checked against the certificate.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, ReplError> {
    ServerName::try_from(host.to_owned()).map_err(|e| {
        ReplError::Config(format!("host {host:?} is not a valid TLS server name: {e}"))
    })
}

/// The client certificate chain and its key, refusing a key file that the group or others
/// may read, as libpq does (a key readable by others is no secret).
fn client_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ReplError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ReplError::Config(format!("reading sslcert {}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(ReplError::Config(format!(
            "sslcert {} holds no certificate",
            cert.display()
        )));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(key)
            .map_err(|e| ReplError::Config(format!("sslkey {}: {e}", key.display())))?;
        let mode = meta.permissions().mode();
        // libpq's rule: 0600 or less when the user owns it, 0640 or less when root does.
        let too_open = if meta.uid() == 0 {
            mode & 0o037 != 0
        } else {
            mode & 0o077 != 0
        };
        if too_open {
            return Err(ReplError::Config(format!(
                "private key file {} has group or world access; permissions should be u=rw (0600) or less if owned by the current user, or u=rw,g=r (0640) or less if owned by root",
                key.display()
            )));
        }
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ReplError::Config(format!("reading sslkey {}: {e}", key.display())))?;
    Ok((chain, key_der))
}

fn root_store(cfg: &ConnectConfig) -> Result<RootCertStore, ReplError> {
    let mut roots = RootCertStore::empty();
    match &cfg.ssl_root_cert {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                ReplError::Config(format!("reading ssl_root_cert {}: {e}", path.display()))
            })?;
            for cert in certs {
                let cert = cert.map_err(|e| {
                    ReplError::Config(format!("parsing ssl_root_cert {}: {e}", path.display()))
                })?;
                roots.add(cert).map_err(|e| {
                    ReplError::Config(format!("ssl_root_cert {}: {e}", path.display()))
                })?;
            }
            if roots.is_empty() {
                return Err(ReplError::Config(format!(
                    "ssl_root_cert {} holds no certificate",
                    path.display()
                )));
            }
        }
        None => {
            // The platform's trust store (on Linux the distribution's bundle, or
            // SSL_CERT_FILE / SSL_CERT_DIR), as `sslrootcert=system` in libpq 16+.
            let found = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(ReplError::Config(format!(
                    "no system root certificate could be loaded ({why}); set PGSSLROOTCERT to the CA that signed the server certificate"
                )));
            }
        }
    }
    Ok(roots)
}

fn webpki_verifier(
    cfg: &ConnectConfig,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, ReplError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(root_store(cfg)?), Arc::clone(provider))
        .build()
        .map_err(|e| ReplError::Tls(format!("building certificate verifier: {e}")))
}

/// Turns a failed handshake into a permanent TLS error when rustls refused it, or an I/O
/// error (retryable) when the transport broke.
pub(crate) fn handshake_error(e: io::Error) -> ReplError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => ReplError::Tls(format!("handshake failed: {tls}")),
        None => ReplError::Io {
            context: "performing the TLS handshake",
            source: e,
        },
    }
}

/// `require`/`prefer`: encryption without authentication of the server, like libpq.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
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

/// `verify-ca` and `verify-full`: webpki's chain check, and what a name that does not
/// match means (see [`NameCheck`]). webpki checks the chain before the name, so a name
/// mismatch means the chain already passed.
#[derive(Debug)]
struct WebPki {
    inner: Arc<WebPkiServerVerifier>,
    names: NameCheck,
}

#[derive(Debug, Clone, Copy)]
enum NameCheck {
    /// `verify-ca`: the name may differ.
    Ignored,
    /// `verify-full`: the host's name or address, with libpq's fallback to the subject's
    /// common name when the certificate has no subjectAltName of the host's kind (dNSName
    /// for a name, iPAddress for an address).
    HostOrCommonName,
}

impl ServerCertVerifier for WebPki {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(
                e @ rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                ),
            ) => match self.names {
                NameCheck::Ignored => Ok(ServerCertVerified::assertion()),
                NameCheck::HostOrCommonName if common_name_matches(end_entity, server_name) => {
                    Ok(ServerCertVerified::assertion())
                }
                NameCheck::HostOrCommonName => Err(e),
            },
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// libpq's common-name rule: consulted only without a subjectAltName of the host's kind;
/// case-insensitive, with a leading `*.` matching one label of a host name.
fn common_name_matches(cert: &[u8], server_name: &ServerName<'_>) -> bool {
    let Some(names) = cert_names(cert) else {
        return false;
    };
    let (host, is_ip) = match server_name {
        ServerName::DnsName(d) => (d.as_ref().to_owned(), false),
        ServerName::IpAddress(ip) => (std::net::IpAddr::from(*ip).to_string(), true),
        _ => return false,
    };
    let has_san_of_kind = if is_ip {
        names.has_ip_san
    } else {
        names.has_dns_san
    };
    if has_san_of_kind {
        return false;
    }
    names.common_names.iter().any(|cn| {
        if cn.eq_ignore_ascii_case(&host) {
            return true;
        }
        match cn.strip_prefix("*.") {
            Some(suffix) if !is_ip => host.split_once('.').is_some_and(|(label, rest)| {
                !label.is_empty() && rest.eq_ignore_ascii_case(suffix)
            }),
            _ => false,
        }
    })
}

struct CertNames {
    common_names: Vec<String>,
    has_dns_san: bool,
    has_ip_san: bool,
}

const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const OID_SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// The subject's common names and which kinds of subjectAltName the certificate has:
/// `TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serial, signature, issuer,
/// validity, subject, subjectPublicKeyInfo, [1], [2] OPTIONAL, [3] extensions OPTIONAL }`.
fn cert_names(der: &[u8]) -> Option<CertNames> {
    let (cert, _) = der_element(der, 0x30)?;
    let (tbs, _) = der_element(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der_any(rest)?.1;
    }
    for _serial_signature_issuer_validity in 0..4 {
        rest = der_any(rest)?.1;
    }
    let (subject, after_subject) = der_element(rest, 0x30)?;
    let mut rest = der_any(after_subject)?.1;
    let mut names = CertNames {
        common_names: Vec::new(),
        has_dns_san: false,
        has_ip_san: false,
    };
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (set, next) = der_element(rdns, 0x31)?;
        rdns = next;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (atv, next) = der_element(atvs, 0x30)?;
            atvs = next;
            let (oid, value) = der_element(atv, 0x06)?;
            // UTF8String, PrintableString, T61String and IA5String carry ASCII host names.
            if oid == OID_COMMON_NAME && matches!(value.first(), Some(0x0c | 0x13 | 0x14 | 0x16)) {
                let (text, _) = der_any(value)?;
                if let Ok(text) = std::str::from_utf8(text) {
                    names.common_names.push(text.to_owned());
                }
            }
        }
    }
    while !rest.is_empty() {
        let tag = *rest.first()?;
        let (contents, next) = der_any(rest)?;
        rest = next;
        if tag != 0xa3 {
            continue;
        }
        let (mut extensions, _) = der_element(contents, 0x30)?;
        while !extensions.is_empty() {
            let (ext, next) = der_element(extensions, 0x30)?;
            extensions = next;
            let (oid, mut ext_rest) = der_element(ext, 0x06)?;
            if oid != OID_SUBJECT_ALT_NAME {
                continue;
            }
            if ext_rest.first() == Some(&0x01) {
                ext_rest = der_any(ext_rest)?.1;
            }
            let (octets, _) = der_element(ext_rest, 0x04)?;
            let (mut general_names, _) = der_element(octets, 0x30)?;
            while !general_names.is_empty() {
                let tag = *general_names.first()?;
                general_names = der_any(general_names)?.1;
                match tag {
                    0x82 => names.has_dns_san = true,
                    0x87 => names.has_ip_san = true,
                    _ => {}
                }
            }
        }
    }
    Some(names)
}

/// RFC 5929 `tls-server-end-point`: the certificate hashed with its signature's hash
/// function, MD5 and SHA-1 becoming SHA-256. `None` where PostgreSQL defines no hash
/// (RSA-PSS, Ed25519, Ed448, anything unrecognised): the server cannot bind such a
/// channel, so the client does not offer to.
pub(crate) fn server_end_point_hash(cert_der: &[u8]) -> Option<Vec<u8>> {
    let oid = signature_oid(cert_der)?;
    let is = |list: &[&[u8]]| list.contains(&oid);
    if is(&[
        OID_MD5_RSA,
        OID_SHA1_RSA,
        OID_SHA256_RSA,
        OID_SHA1_ECDSA,
        OID_SHA256_ECDSA,
    ]) {
        Some(sha2::Sha256::digest(cert_der).to_vec())
    } else if is(&[OID_SHA224_RSA, OID_SHA224_ECDSA]) {
        Some(sha2::Sha224::digest(cert_der).to_vec())
    } else if is(&[OID_SHA384_RSA, OID_SHA384_ECDSA]) {
        Some(sha2::Sha384::digest(cert_der).to_vec())
    } else if is(&[OID_SHA512_RSA, OID_SHA512_ECDSA]) {
        Some(sha2::Sha512::digest(cert_der).to_vec())
    } else {
        None
    }
}

const OID_MD5_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04];
const OID_SHA1_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05];
const OID_SHA256_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
const OID_SHA384_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];
const OID_SHA512_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d];
const OID_SHA224_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0e];
const OID_SHA1_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
const OID_SHA224_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x01];
const OID_SHA256_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
const OID_SHA384_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
const OID_SHA512_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04];

/// `Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm SEQUENCE { OID, … }, … }`.
fn signature_oid(der: &[u8]) -> Option<&[u8]> {
    let (cert, _) = der_element(der, 0x30)?;
    let (_tbs, rest) = der_any(cert)?;
    let (alg, _) = der_element(rest, 0x30)?;
    let (oid, _) = der_element(alg, 0x06)?;
    Some(oid)
}

fn der_element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    if *input.first()? != tag {
        return None;
    }
    der_any(input)
}

/// Splits one DER TLV off `input`: (contents, remainder).
fn der_any(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let first_len = *input.get(1)?;
    let (len, header) = if first_len < 0x80 {
        (usize::from(first_len), 2)
    } else {
        let n = usize::from(first_len & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let bytes = input.get(2..2 + n)?;
        let len = bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, 2 + n)
    };
    let contents = input.get(header..header.checked_add(len)?)?;
    Some((contents, input.get(header + len..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_point_hash_follows_signature_algorithm() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert_eq!(server_end_point_hash(cert.der()).map(|h| h.len()), Some(48));
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert_eq!(
            server_end_point_hash(cert.der()),
            Some(sha2::Sha256::digest(cert.der()).to_vec())
        );
        assert_eq!(server_end_point_hash(b"garbage"), None);
        // PostgreSQL defines no hash for Ed25519 (nor RSA-PSS): no binding offered.
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert_eq!(server_end_point_hash(cert.der()), None);
    }

    fn cert_with(cn: &str, sans: Vec<rcgen::SanType>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.subject_alt_names = sans;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn name(host: &str) -> ServerName<'static> {
        ServerName::try_from(host.to_owned()).unwrap()
    }

    #[test]
    fn common_name_only_without_a_subject_alt_name_of_the_hosts_kind() {
        let cn_only = cert_with("DB.Example.com", vec![]);
        assert!(common_name_matches(&cn_only, &name("db.example.com")));
        assert!(!common_name_matches(&cn_only, &name("other.example.com")));
        assert!(!common_name_matches(&cn_only, &name("10.0.0.1")));
        let wildcard = cert_with("*.example.com", vec![]);
        assert!(common_name_matches(&wildcard, &name("db.example.com")));
        assert!(!common_name_matches(&wildcard, &name("a.db.example.com")));
        assert!(!common_name_matches(&wildcard, &name("example.com")));
        // A DNS SAN hides the CN from a host name, not from an address.
        let dns_san = cert_with(
            "10.0.0.1",
            vec![rcgen::SanType::DnsName(
                "other.example.com".try_into().unwrap(),
            )],
        );
        assert!(!common_name_matches(&dns_san, &name("other.example.org")));
        assert!(common_name_matches(&dns_san, &name("10.0.0.1")));
        let ip_san = cert_with(
            "10.0.0.1",
            vec![rcgen::SanType::IpAddress("10.0.0.2".parse().unwrap())],
        );
        assert!(!common_name_matches(&ip_san, &name("10.0.0.1")));
        assert!(!common_name_matches(b"garbage", &name("db.example.com")));
    }
}
