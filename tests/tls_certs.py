"""Throw-away certificate authorities and certificates for the TLS tests (never for production).

`issue_tls_set(dir)` writes a serving CA, the extender's serving certificate (for 127.0.0.1,
localhost and the in-cluster Service name), a client CA with one client certificate for the
scheduler, and a second, unrelated CA with a client certificate that must be refused.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_NAMES = ("localhost", "linkpack-extender.linkpack-system.svc")


@dataclass(frozen=True)
class TlsSet:
    server_ca: Path
    server_cert: Path
    server_key: Path
    client_ca: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate from a CA the extender does not trust
    rogue_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_path = path.with_suffix(".key")
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key_path.chmod(0o600)


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], server: bool
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVICE_NAMES]
        names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca[1], hashes.SHA256()), key


def issue_tls_set(directory: Path) -> TlsSet:
    directory.mkdir(parents=True, exist_ok=True)
    server_ca = _ca("linkpack-extender-ca")
    client_ca = _ca("linkpack-scheduler-client-ca")
    rogue_ca = _ca("somebody-else-ca")
    files = {
        "server-ca.crt": (server_ca[0], None),
        "client-ca.crt": (client_ca[0], None),
    }
    server = _leaf("linkpack-extender", server_ca, server=True)
    client = _leaf("linkpack-scheduler", client_ca, server=False)
    rogue = _leaf("linkpack-scheduler", rogue_ca, server=False)
    for name, (cert, key) in {
        **files,
        "server.crt": server,
        "client.crt": client,
        "rogue.crt": rogue,
    }.items():
        _write(directory / name, cert, key)
    return tls_set_in(directory)


def tls_set_in(directory: Path) -> TlsSet:
    """The files `issue_tls_set` writes in `directory`."""
    return TlsSet(
        server_ca=directory / "server-ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_ca=directory / "client-ca.crt",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        rogue_cert=directory / "rogue.crt",
        rogue_key=directory / "rogue.key",
    )
