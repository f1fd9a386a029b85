"""The client over TLS: a daemon started with ``--tls-cert``/``--tls-key``
(and ``--tls-client-ca`` for client certificates), certificates made here
for the test by a CA of its own."""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from conftest import CONSTRAINT, REPO, admit_tools, small_session
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ctxbroker_client import Broker, LocalDaemon, Tls, find_binary, user
from ctxbroker_client.errors import BrokerError


class Authority:
    """A CA that signs certificates for the test, written as PEM files."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.name = subject
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = self._write(
            f"{name}.pem", self.cert.public_bytes(serialization.Encoding.PEM)
        )

    def _write(self, name: str, data: bytes) -> str:
        path = self.directory / name
        path.write_bytes(data)
        return str(path)

    def issue(self, name: str, *, server: bool) -> tuple[str, str]:
        """A certificate for ``name`` (for 127.0.0.1 and localhost when
        ``server``), signed by this CA: (certificate file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        cert = builder.sign(self.key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return (
            self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{name}.key", key_pem),
        )


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Authority, Authority]:
    """The daemon's CA and another one, which the daemon does not trust."""
    return Authority(tmp_path, "ctxbroker-test-ca"), Authority(tmp_path, "stranger-ca")


def mutual_tls_daemon(ca: Authority, client: str) -> tuple[LocalDaemon, Tls]:
    """A daemon serving TLS that asks for client certificates from ``ca``
    (not started), and the TLS settings of a client named ``client`` that
    holds one."""
    cert, key = ca.issue("daemon", server=True)
    client_cert, client_key = ca.issue(client, server=False)
    tls = Tls(ca_file=ca.ca_file, cert_file=client_cert, key_file=client_key)
    daemon = LocalDaemon(
        find_binary(REPO),
        args=["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca.ca_file],
        tls=tls,
    )
    return daemon, tls


def test_the_client_speaks_tls_with_the_right_ca_and_not_with_another(pki) -> None:
    ca, stranger = pki
    cert, key = ca.issue("daemon", server=True)
    with LocalDaemon(
        find_binary(REPO),
        args=["--tls-cert", cert, "--tls-key", key],
        tls=Tls(ca_file=ca.ca_file),
    ) as daemon:
        with Broker(daemon.address, tls=Tls(ca_file=ca.ca_file), timeout=10) as broker:
            broker.create_session("tls", window_tokens=4000)
            admitted = broker.admit("tls", [user(CONSTRAINT)])
            assert admitted.spans[0].span_class == 2  # SPAN_CLASS_CONSTRAINT
        # A CA that did not sign the daemon's certificate: no connection.
        with Broker(
            daemon.address, tls=Tls(ca_file=stranger.ca_file), timeout=3, wait_for_ready=False
        ) as broker:
            with pytest.raises(BrokerError) as refused:
                broker.server_info()
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        # Plaintext to a TLS daemon: no answer either.
        with Broker(daemon.address, timeout=3, wait_for_ready=False) as broker:
            with pytest.raises(BrokerError) as refused:
                broker.server_info()
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE


def test_a_daemon_that_asks_for_client_certificates_serves_only_clients_with_one(pki) -> None:
    ca, stranger = pki
    other_cert, other_key = stranger.issue("intruder", server=False)
    daemon, with_cert = mutual_tls_daemon(ca, "agent")
    with daemon:
        with Broker(daemon.address, tls=with_cert, timeout=10) as broker:
            assert broker.server_info().version
        for refused_tls in (
            Tls(ca_file=ca.ca_file),
            Tls(ca_file=ca.ca_file, cert_file=other_cert, key_file=other_key),
        ):
            with Broker(daemon.address, tls=refused_tls, timeout=3, wait_for_ready=False) as broker:
                with pytest.raises(BrokerError) as refused:
                    broker.server_info()
                assert refused.value.code == grpc.StatusCode.UNAVAILABLE


def test_the_node_watcher_reads_markers_over_tls_with_a_client_certificate(pki) -> None:
    node = shutil.which("node")
    assert node, "node is needed for the cross-language test"
    ca, _ = pki
    daemon, with_cert = mutual_tls_daemon(ca, "watcher")
    with daemon:
        with Broker(daemon.address, tls=with_cert, timeout=10) as broker:
            small_session(broker, "watched")
            markers = admit_tools(broker, "watched", range(6))
        assert markers, "no compaction to watch"
        watched = subprocess.run(
            [
                node,
                str(REPO / "clients" / "node" / "watch.js"),
                "--addr",
                daemon.address,
                "--tls-ca",
                ca.ca_file,
                "--tls-cert",
                str(with_cert.cert_file),
                "--tls-key",
                str(with_cert.key_file),
                "--from-seq",
                "1",
                "--until-seq",
                str(markers[-1].seq),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert watched.returncode == 0, watched.stderr
    seen = [json.loads(line)["seq"] for line in watched.stdout.splitlines()]
    assert seen == [m.seq for m in markers], (seen, watched.stderr)


def test_grpcurl_speaks_tls_with_a_client_certificate(pki) -> None:
    grpcurl = shutil.which("grpcurl")
    assert grpcurl, "grpcurl is needed (.ci/clients.sh installs it)"
    ca, _ = pki
    daemon, with_cert = mutual_tls_daemon(ca, "operator")
    with daemon:

        def call(*tls_flags: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [
                    grpcurl,
                    *tls_flags,
                    daemon.address,
                    "ctxbroker.v1.ContextBroker/GetServerInfo",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )

        answered = call(
            "-cacert",
            ca.ca_file,
            "-cert",
            str(with_cert.cert_file),
            "-key",
            str(with_cert.key_file),
        )
        assert answered.returncode == 0, answered.stderr
        assert json.loads(answered.stdout)["version"]
        refused = call("-cacert", ca.ca_file)
        assert refused.returncode != 0, refused.stdout


def test_tls_settings_are_checked_in_the_client() -> None:
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        Tls(ca_file=__file__, cert_file=__file__).credentials()
