"""A hub that cannot be reached ends in one line naming what was fetched and the offline way out, for the chains
transformers and huggingface_hub raise (built here from the libraries' own classes, as recorded without network:
OSError <- LocalEntryNotFoundError <- httpx.ConnectError(request) <- socket.gaierror)."""

import socket
from dataclasses import dataclass

import httpx
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from palaestra.shared import cli
from palaestra.shared.config import JobConfig
from palaestra.shared.hub_errors import hub_error_message
from palaestra.shared.jobs import job

URL = "https://huggingface.co/Qwen/Qwen3-4B-Instruct-2507/resolve/main/config.json"


def offline_chain() -> OSError:
    """The chain `AutoTokenizer.from_pretrained(hub id)` raised on this machine without network."""
    try:
        try:
            try:
                try:
                    raise socket.gaierror(-2, "Name or service not known")
                except socket.gaierror as err:
                    raise httpx.ConnectError(
                        "[Errno -2] Name or service not known", request=httpx.Request("GET", URL)
                    ) from err
            except httpx.ConnectError as err:
                raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub") from err
        except LocalEntryNotFoundError as err:
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files") from err
    except OSError as err:
        return err


def test_the_line_names_the_url_the_cause_and_the_way_out():
    line = hub_error_message(offline_chain())
    assert line is not None and "\n" not in line
    assert line.startswith(f"could not reach {URL} ([Errno -2] Name or service not known)")
    assert "HF_HUB_OFFLINE=1" in line and "local path" in line


def test_a_bare_connect_error_names_its_request():
    err = httpx.ConnectError("[Errno -2] Name or service not known", request=httpx.Request("GET", "https://x.org/a"))
    assert hub_error_message(err).startswith("could not reach https://x.org/a (")


def test_other_errors_are_not_hub_errors():
    assert hub_error_message(OSError("disk full")) is None
    assert hub_error_message(ValueError("bad value")) is None


@dataclass
class FetchConfig(JobConfig):
    offline: bool = True


@job("test.fetch_from_hub", FetchConfig)
def fetch(cfg, tracker):
    """Fails as a hub download does without network (or with an unrelated error)."""
    raise offline_chain() if cfg.offline else OSError("disk full")


def test_the_cli_prints_it_as_one_line_with_status_2(tmp_path, tracking, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(
        f"job: test.fetch_from_hub\ntracking: {{uri: '{tracking.uri}', artifact_root: '{tracking.artifact_root}'}}\n"
    )
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # MLflow's own log lines come first
    assert err.startswith(f"palaestra: error: could not reach {URL}") and "HF_HUB_OFFLINE=1" in err
    with pytest.raises(OSError, match="disk full"):  # control: an error of another kind keeps its traceback
        cli.main(["run", str(path), "offline=false"])
