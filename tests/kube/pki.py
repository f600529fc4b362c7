"""Keys and certificates the control plane needs, made with `cryptography` (already a JupyterHub
dependency): the service-account signing key, and a CA plus a serving certificate for the kubelet
simulator so the API server can reach it over verified HTTPS (pod logs)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID


def _key(bits: int = 2048):
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def _write_key(key, path: Path):
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _cert(subject: str, public_key, issuer: str, signing_key, *, ca: bool, sans=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(public_key)
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def make_pki(directory: Path) -> dict[str, Path]:
    """Writes sa.key, kubelet-ca.crt, kubelet.crt and kubelet.key; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in
             ("sa.key", "kubelet-ca.crt", "kubelet.crt", "kubelet.key")}
    _write_key(_key(), paths["sa.key"])
    ca_key = _key()
    ca = _cert("kubelet-sim-ca", ca_key.public_key(), "kubelet-sim-ca", ca_key, ca=True)
    paths["kubelet-ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    key = _key()
    # The kubelet simulator listens on 127.0.0.1; every simulated node reports that address.
    sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert = _cert("kubelet-sim", key.public_key(), "kubelet-sim-ca", ca_key, ca=False, sans=sans)
    paths["kubelet.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, paths["kubelet.key"])
    return paths
