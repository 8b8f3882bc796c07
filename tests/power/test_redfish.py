"""The Redfish backend against the real sushy-tools emulator, plus a loopback stub for faults.

The emulator (openstack sushy-tools, fake systems driver) is the main path:
discovery, state, a verified power cycle, credentials, TLS and a real 4xx.
Its fake driver applies a reset after a random 1-11 s
(docs/facts.md, "Redfish"), so there is exactly one real cycle here. What the
emulator cannot do on demand (409 Conflict, a POST that never answers, a 500,
a BMC that does not offer ForceOff) is played by a small stub serving recorded
JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
import requests

from spark_watchdog.config.controller import RedfishDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, Refused, Unreachable
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import CommandSpacing, PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.redfish import (
    RedfishSystem,
    build_redfish_backend,
    choose_reset_type,
    redfish_error_message,
)

ON, OFF, MIXED = PowerState.ON, PowerState.OFF, PowerState.MIXED
USER, PASSWORD = "admin", "redfish-test-pw"
SYSTEM_A = "27946b59-9e44-4fa7-8e91-f3527a1ef094"
SYSTEM_B = "a4b7c5f0-2d2e-4c54-9e3f-0c7f5d0b1e2a"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "redfish"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- the real emulator --------------------------------------------------------------


@dataclass
class Emulator:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path


def _sushy_executable() -> str:
    beside = Path(sys.executable).with_name("sushy-emulator")
    found = str(beside) if beside.exists() else shutil.which("sushy-emulator")
    if found is None:
        pytest.skip("sushy-emulator not found: pip install sushy-tools")
    return found


def _htpasswd(path: Path) -> None:
    bcrypt = pytest.importorskip("bcrypt", reason="bcrypt (a sushy-tools dependency)")
    # sushy-tools' basic auth accepts bcrypt entries only; 4 rounds keeps it quick.
    digest = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"{USER}:{digest}\n")


@contextlib.contextmanager
def sushy_emulator(workdir: Path, extra: dict[str, Any]) -> Iterator[Emulator]:
    """Start sushy-emulator (fake driver, basic auth) on a free loopback port."""
    executable = _sushy_executable()
    workdir.mkdir(parents=True, exist_ok=True)
    _htpasswd(workdir / "htpasswd")
    settings: dict[str, Any] = {
        "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        # The fake driver keeps its systems in sqlite under this directory, and
        # only adds configured systems it has not seen: without a fresh directory
        # a second run starts from the first run's power states.
        "SUSHY_EMULATOR_STATE_DIR": str(workdir / "state"),
        "SUSHY_EMULATOR_AUTH_FILE": str(workdir / "htpasswd"),
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [
            {"uuid": SYSTEM_A, "name": "node-a", "power_state": "On", "nics": []},
        ],
        **extra,
    }
    scheme = "https" if "SUSHY_EMULATOR_SSL_CERT" in settings else "http"
    for _attempt in range(3):
        port = free_port()
        settings["SUSHY_EMULATOR_LISTEN_PORT"] = port
        config = workdir / "emulator.conf"
        config.write_text("".join(f"{k} = {v!r}\n" for k, v in settings.items()))
        log_path = workdir / f"emulator-{port}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                [executable, "--config", str(config)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        url = f"{scheme}://127.0.0.1:{port}"
        if _wait_ready(process, url):
            try:
                yield Emulator(url, process, log_path)
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
            return
        process.kill()
        process.wait(timeout=10)
    pytest.fail(f"sushy-emulator did not start: {log_path.read_text()[-2000:]}")


def _wait_ready(process: subprocess.Popen[bytes], url: str, limit: float = 20.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False  # e.g. the port was taken between free_port() and bind
        try:
            # The service root is outside the emulator's auth, and TLS may be self-signed.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                requests.get(f"{url}/redfish/v1/", timeout=1, verify=False)
            return True
        except requests.RequestException:
            time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    two_systems = [
        {"uuid": SYSTEM_A, "name": "node-a", "power_state": "On", "nics": []},
        {"uuid": SYSTEM_B, "name": "node-b", "power_state": "On", "nics": []},
    ]
    with sushy_emulator(
        tmp_path_factory.mktemp("sushy"), {"SUSHY_EMULATOR_FAKE_SYSTEMS": two_systems}
    ) as emu:
        yield emu


def backend(url: str, **kwargs: Any) -> RedfishSystem:
    kwargs.setdefault("timeout", 5.0)
    password = Secret(kwargs.pop("password", PASSWORD), "test")
    return RedfishSystem(url, kwargs.pop("user", USER), password, **kwargs)


def quick_timing(power_timeout: float = 20.0) -> PowerTiming:
    return PowerTiming(
        poll_interval=0.5,
        power_timeout=power_timeout,
        min_command_interval=0.2,
        read_timeout=5.0,
        command_timeout=10.0,
    )


@pytest.mark.integration
def test_discovers_the_configured_system_and_reads_its_state(emulator: Emulator) -> None:
    system = backend(emulator.url, system=SYSTEM_A)
    assert run(system.read_state()) is ON
    assert run(system.system_path()) == f"/redfish/v1/Systems/{SYSTEM_A}"
    assert system.name == f"redfish {emulator.url} system {SYSTEM_A}"
    assert system.limiter_key == f"redfish:127.0.0.1:{emulator.url.rsplit(':', 1)[1]}"


@pytest.mark.integration
def test_several_systems_and_none_configured_names_them_all(emulator: Emulator) -> None:
    with pytest.raises(Refused) as caught:
        run(backend(emulator.url).read_state())
    message = caught.value.message
    assert "2 systems behind this BMC" in message
    assert SYSTEM_A in message and SYSTEM_B in message
    assert "set system" in message


@pytest.mark.integration
def test_an_unknown_system_names_the_ones_there(emulator: Emulator) -> None:
    with pytest.raises(Refused, match=f'no system "node-z".*{SYSTEM_A}'):
        run(backend(emulator.url, system="node-z").read_state())


@pytest.mark.integration
def test_the_reset_action_is_the_one_the_system_advertises(emulator: Emulator) -> None:
    system = backend(emulator.url, system=SYSTEM_A)
    action = run(system.reset_action(run(system.system_path())))
    assert action.target == f"/redfish/v1/Systems/{SYSTEM_A}/Actions/ComputerSystem.Reset"
    assert action.allowed is not None and "ForceOff" in action.allowed
    # sushy-tools' fake driver offers no PowerCycle (docs/facts.md, "Redfish"): off
    # then on it is.
    assert "PowerCycle" not in action.allowed


@pytest.mark.integration
def test_verified_cycle_against_the_emulator(emulator: Emulator) -> None:
    steps: list[str] = []

    async def record(step: Any) -> None:
        steps.append(step.name)

    power = VerifiedPower(
        backend(emulator.url, system=SYSTEM_B),
        quick_timing(),
        on_step=record,
        spacing=CommandSpacing(),
    )
    result = run(power.cycle(off_seconds=1.0))
    assert result.verified is True
    assert result.state_before is ON and result.state_after is ON
    assert result.off_held_s is not None and result.off_held_s >= 1.0
    assert steps == [
        "off_requested",
        "off_verified",
        "hold_started",
        "hold_done",
        "on_requested",
        "on_verified",
    ]
    # And the emulator agrees, read by a separate client.
    answer = requests.get(
        f"{emulator.url}/redfish/v1/Systems/{SYSTEM_B}", auth=(USER, PASSWORD), timeout=5
    )
    assert answer.json()["PowerState"] == "On"


@pytest.mark.integration
def test_a_wrong_password_is_refused_without_echoing_it(emulator: Emulator) -> None:
    system = backend(emulator.url, system=SYSTEM_A, password="not-the-password")
    with pytest.raises(Refused) as caught:
        run(system.read_state())
    assert "credentials rejected (HTTP 401)" in caught.value.message
    assert "Incorrect username or password" in caught.value.message
    assert "not-the-password" not in str(caught.value)
    with pytest.raises(Refused, match="credentials rejected"):
        run(system.command(OFF))


@pytest.mark.integration
def test_nothing_listening_is_unreachable_and_nothing_was_sent() -> None:
    system = backend(f"http://127.0.0.1:{free_port()}", system=SYSTEM_A)
    with pytest.raises(Unreachable, match=r"cannot connect .*nothing was sent"):
        run(system.read_state())
    with pytest.raises(Unreachable, match="nothing was sent"):
        run(system.command(OFF))


@pytest.mark.integration
def test_a_refused_reset_quotes_the_service(tmp_path: Path) -> None:
    # SUSHY_EMULATOR_DISABLE_POWER_OFF makes the real emulator answer 400 to ForceOff.
    with sushy_emulator(tmp_path, {"SUSHY_EMULATOR_DISABLE_POWER_OFF": True}) as emu:
        system = backend(emu.url)  # one system: found without naming it
        with pytest.raises(Refused) as caught:
            run(system.command(OFF))
        message = caught.value.message
        assert message.startswith("ForceOff refused (HTTP 400):")
        assert '"Can not request power off transition' in message
        assert run(system.read_state()) is ON


# --- TLS ---------------------------------------------------------------------------


@dataclass
class CertFiles:
    ca_file: Path
    cert_file: Path
    key_file: Path


def make_test_ca(directory: Path) -> CertFiles:
    """A throwaway CA and a 127.0.0.1 server certificate it signed."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spark-watchdog test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = CertFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    paths.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.mark.integration
def test_tls_is_verified_by_default_and_ca_file_is_honoured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = make_test_ca(tmp_path)
    tls = {"SUSHY_EMULATOR_SSL_CERT": str(ca.cert_file), "SUSHY_EMULATOR_SSL_KEY": str(ca.key_file)}
    with sushy_emulator(tmp_path / "emu", tls) as emu:
        assert emu.url.startswith("https://")
        with pytest.raises(Unreachable, match=r"TLS certificate not trusted.*nothing was sent"):
            run(backend(emu.url).read_state())
        with pytest.raises(Unreachable, match="TLS certificate not trusted"):
            run(backend(emu.url).command(OFF))
        assert run(backend(emu.url, ca_file=str(ca.ca_file)).read_state()) is ON
        with caplog.at_level(logging.WARNING, logger="spark_watchdog.power.redfish"):
            unverified = backend(emu.url, verify_tls=False)
        assert "TLS verification is off" in caplog.text
        assert run(unverified.read_state()) is ON


# --- a stub BMC for what the emulator will not do on demand ----------------------------


def load_sample(name: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((FIXTURES / name).read_text()))


@dataclass
class StubBmc:
    """Serves a recorded ComputerSystem; POSTs follow ``post_script`` (status or "stall")."""

    system: dict[str, Any]
    action_info: dict[str, Any] | None = None
    post_script: list[int | str] = field(default_factory=list)
    get_status: int = 200
    posts: list[dict[str, Any]] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    stall_s: float = 3.0
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def system_path(self) -> str:
        return str(self.system["@odata.id"])

    def answer_get(self, path: str) -> tuple[int, Any]:
        self.gets.append(path)
        if self.get_status != 200:
            return self.get_status, {"error": {"code": "Base.1.0.InternalError", "message": "boom"}}
        if path in ("/redfish/v1", "/redfish/v1/"):
            return 200, {
                "@odata.id": "/redfish/v1/",
                "Systems": {"@odata.id": "/redfish/v1/Systems"},
            }
        if path == "/redfish/v1/Systems":
            return 200, {"Members": [{"@odata.id": self.system_path}], "Members@odata.count": 1}
        if path == self.system_path:
            return 200, self.system
        if self.action_info is not None and path == self.action_info["@odata.id"]:
            return 200, self.action_info
        return 404, {"error": {"code": "Base.1.0.ResourceMissingAtURI", "message": path}}

    def answer_post(self, path: str, body: dict[str, Any]) -> tuple[int | str, Any]:
        self.posts.append({"path": path, **body})
        step = self.post_script.pop(0) if self.post_script else 204
        if step == 409:
            return 409, {
                "error": {
                    "code": "Base.1.8.GeneralError",
                    "message": "A general error has occurred.",
                    "@Message.ExtendedInfo": [
                        {
                            "MessageId": "Base.1.8.ResourceInUse",
                            "Message": "The change could not be made because the resource was in "
                            "use or in a transitioning state.",
                        }
                    ],
                }
            }
        if step in (204, "stall"):
            reset = body.get("ResetType")
            self.system["PowerState"] = "Off" if reset == "ForceOff" else "On"
        if step == 500:
            return 500, {"error": {"code": "Base.1.0.InternalError", "message": "internal error"}}
        if step == 302:
            return 302, None
        return step, None


class _StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def bmc(self) -> StubBmc:
        return cast(StubBmc, cast(Any, self.server).bmc)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        status, body = self.bmc.answer_get(self.path)
        self._send(status, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        status, answer = self.bmc.answer_post(self.path, body)
        if status == "stall":  # applied, then no answer: a timeout after sending
            self.bmc.stopping.wait(self.bmc.stall_s)
            self.close_connection = True
            return
        self._send(int(status), answer)

    def _send(self, status: int, body: Any) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "/elsewhere")
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def stub_bmc(bmc: StubBmc) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
    server.daemon_threads = True
    cast(Any, server).bmc = bmc
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        bmc.stopping.set()
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.mark.integration
def test_a_bmc_without_forceoff_is_refused_and_nothing_is_sent() -> None:
    bmc = StubBmc(load_sample("system_without_forceoff.json"))
    with stub_bmc(bmc) as url:
        system = backend(url)
        with pytest.raises(Refused) as caught:
            run(system.command(OFF))
        message = caught.value.message
        assert "does not offer ForceOff" in message
        assert "it allows: On, GracefulShutdown, GracefulRestart, Nmi" in message
        assert "GracefulShutdown cannot stop a frozen host" in message
        assert bmc.posts == []
        run(system.command(ON))  # On is offered: used
        assert bmc.posts == [
            {"path": bmc.system_path + "/Actions/ComputerSystem.Reset", "ResetType": "On"}
        ]


@pytest.mark.integration
def test_allowed_reset_types_may_come_from_action_info() -> None:
    sample = load_sample("system_with_action_info.json")
    bmc = StubBmc(sample["system"], action_info=sample["action_info"])
    with stub_bmc(bmc) as url:
        system = backend(url)
        action = run(system.reset_action(bmc.system_path))
        assert action.allowed == ("ForceOn", "ForceOff", "ForceRestart")
        bmc.system["PowerState"] = "Off"
        run(system.command(ON))
        # The target is the advertised one, not a path built here.
        assert bmc.posts == [
            {"path": "/redfish/v1/Systems/Self/Actions/Oem/Reset", "ResetType": "ForceOn"}
        ]


@pytest.mark.integration
def test_409_conflict_is_retried_until_the_bmc_accepts() -> None:
    bmc = StubBmc(load_sample("system_without_forceoff.json"), post_script=[409, 409, 204])
    bmc.system["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"].append(
        "ForceOff"
    )
    bmc.system["PowerState"] = "On"  # else "already off" would end it after the first 409
    with stub_bmc(bmc) as url:
        run(backend(url, conflict_retries=3, conflict_delay=0.05).command(OFF))
    assert [post["ResetType"] for post in bmc.posts] == ["ForceOff"] * 3
    assert bmc.system["PowerState"] == "Off"


@pytest.mark.integration
def test_409_for_ever_is_refused_after_a_bounded_number_of_tries() -> None:
    bmc = StubBmc(load_sample("system_without_forceoff.json"), post_script=[409] * 10)
    assert bmc.system["PowerState"] == "Off"
    with stub_bmc(bmc) as url, pytest.raises(Refused) as caught:
        run(backend(url, conflict_retries=2, conflict_delay=0.05).command(ON))
    assert len(bmc.posts) == 3
    assert "409 Conflict 3 times" in caught.value.message
    assert "transitioning state" in caught.value.message


@pytest.mark.integration
def test_409_when_already_there_is_not_resent() -> None:
    bmc = StubBmc(load_sample("system_without_forceoff.json"), post_script=[409] * 10)
    bmc.system["PowerState"] = "On"
    with stub_bmc(bmc) as url:
        run(backend(url, conflict_retries=3, conflict_delay=0.05).command(ON))
    assert len(bmc.posts) == 1


@pytest.mark.integration
def test_a_post_that_never_answers_is_ambiguous_and_read_back_verifies() -> None:
    sample = load_sample("system_without_forceoff.json")
    sample["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = [
        "On",
        "ForceOff",
    ]
    bmc = StubBmc(sample, post_script=["stall"], stall_s=5.0)
    with stub_bmc(bmc) as url:
        system = backend(url, timeout=0.5)
        with pytest.raises(Ambiguous, match=r"no answer within 0\.5s after the request was sent"):
            run(system.command(OFF))
        assert len(bmc.posts) == 1
        # Through VerifiedPower: the stall is read back, never resent.
        bmc.system["PowerState"] = "On"
        bmc.post_script = ["stall"]
        steps: list[str] = []

        async def record(step: Any) -> None:
            steps.append(step.name)

        power = VerifiedPower(
            system, quick_timing(power_timeout=3.0), on_step=record, spacing=CommandSpacing()
        )
        result = run(power.off())
    assert result.verified is True and result.state_after is OFF
    assert steps == ["off_requested", "off_ambiguous", "off_verified"]
    assert len(bmc.posts) == 2


@pytest.mark.integration
def test_a_500_on_reset_is_ambiguous_and_on_a_read_unreachable() -> None:
    sample = load_sample("system_without_forceoff.json")
    bmc = StubBmc(sample, post_script=[500])
    with stub_bmc(bmc) as url:
        system = backend(url)
        with pytest.raises(Ambiguous, match='HTTP 500: "internal error"; it may have been applied'):
            run(system.command(ON))
        bmc.get_status = 503
        with pytest.raises(Unreachable, match="HTTP 503"):
            run(system.read_state())


@pytest.mark.integration
def test_a_redirected_reset_is_not_followed() -> None:
    bmc = StubBmc(load_sample("system_without_forceoff.json"), post_script=[302])
    with stub_bmc(bmc) as url, pytest.raises(Refused, match=r"redirected .*to /elsewhere; not"):
        run(backend(url).command(ON))
    assert "/elsewhere" not in bmc.gets


@pytest.mark.integration
@pytest.mark.parametrize(
    ("power_state", "expected"),
    [("On", ON), ("Off", OFF), ("PoweringOn", MIXED), ("PoweringOff", MIXED), ("Paused", ON)],
)
def test_power_states_map_and_transitions_verify_neither(
    power_state: str, expected: PowerState
) -> None:
    bmc = StubBmc(load_sample("system_without_forceoff.json"))
    bmc.system["PowerState"] = power_state
    with stub_bmc(bmc) as url:
        assert run(backend(url).read_state()) is expected


@pytest.mark.integration
@pytest.mark.parametrize("power_state", ["Banana", None, 1])
def test_an_unknown_power_state_is_a_clear_error(power_state: object) -> None:
    bmc = StubBmc(load_sample("system_without_forceoff.json"))
    bmc.system["PowerState"] = power_state
    expected = rf"unexpected PowerState {re.escape(repr(power_state))}.*expected one"
    with stub_bmc(bmc) as url, pytest.raises(Refused, match=expected):
        run(backend(url).read_state())


# --- pure logic ----------------------------------------------------------------------


def test_reset_type_choice() -> None:
    assert choose_reset_type(OFF, ["On", "ForceOff", "GracefulShutdown"]) == "ForceOff"
    assert choose_reset_type(ON, ["ForceOn", "On"]) == "On"
    assert choose_reset_type(ON, ["ForceOn", "ForceOff"]) == "ForceOn"
    # Nothing advertised: the standard types are assumed (as sushy does).
    assert choose_reset_type(OFF, None) == "ForceOff"
    with pytest.raises(ValueError, match="does not offer ForceOff"):
        choose_reset_type(OFF, ["GracefulShutdown", "PushPowerButton"])
    with pytest.raises(ValueError, match="neither On nor ForceOn"):
        choose_reset_type(ON, ["ForceOff"])
    with pytest.raises(ValueError, match="cannot switch a system to mixed"):
        choose_reset_type(MIXED, None)


def test_redfish_error_messages_are_quoted() -> None:
    body = {
        "error": {
            "code": "Base.1.8.GeneralError",
            "message": "A general error has occurred.",
            "@Message.ExtendedInfo": [
                {"MessageId": "Base.1.8.PropertyValueNotInList", "Message": "Bad ResetType."},
                {"MessageId": "Base.1.8.Other"},
            ],
        }
    }
    assert redfish_error_message(body, "") == (
        '"A general error has occurred."; "Bad ResetType."; "Base.1.8.Other"'
    )
    assert redfish_error_message(None, "<html>Bad Gateway</html>") == '"<html>Bad Gateway</html>"'
    assert redfish_error_message(None, "") == "no message"


def test_build_redfish_backend_from_config() -> None:
    device = RedfishDevice(
        type="redfish",
        url="https://root:leaked@bmc.example:8443/redfish/v1",
        user="admin",
        password_file="/run/credentials/bmc",
        system="1",
    )
    system = build_redfish_backend(device, {"password_file": Secret("pw", "test")})
    # Userinfo in the URL is dropped; the name and key never carry it.
    assert system.name == "redfish https://bmc.example:8443 system 1"
    assert system.limiter_key == "redfish:bmc.example:8443"
    with pytest.raises(ConfigError, match="password_file"):
        build_redfish_backend(device, {})
