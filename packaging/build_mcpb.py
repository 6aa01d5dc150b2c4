"""Build the Claude Desktop extension: dist/proxmox-guard-mcp-<version>.mcpb, a zip of
packaging/mcpb/manifest.json, its icon, and the server as the wheel ships it (the modules, the API
catalog, the views, the simulated lab) under server/, with its dependencies under server/lib.

    python packaging/build_mcpb.py                      # for this machine's platform and Python
    python packaging/build_mcpb.py --platform macosx_11_0_arm64 --python-version 3.12
    python packaging/build_mcpb.py --no-deps            # the bundle without server/lib (tests)

The dependencies come from pip's own default index, as wheels for the target (pydantic-core,
cryptography and bcrypt are compiled: a bundle runs on the platform and Python it was built for).
Claude Desktop starts `python3 server/server.py` (`python` on Windows) with PYTHONPATH=server/lib and
the user's answers to the manifest's user_config as variables; server/ holds no pyproject.toml, so
the server reads further settings from the user's config directory (config.settings_dir), never from
inside the extension. icon.png is views/icon.svg drawn at 256 px.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "packaging" / "mcpb" / "manifest.json"
BESIDE = ("requirements.txt", "LICENSE")


def shipped() -> list[str]:
    """The wheel's files as patterns, read from pyproject.toml (its modules, packages and their data), so
    that a module or package added there is in the extension too."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setup.get("package-data", {})
    return [f"{module}.py" for module in setup["py-modules"]] + [
        f"{package}/{pattern}" for package in setup["packages"] for pattern in ["*.py", *data.get(package, [])]] + list(
        BESIDE)


def server_files() -> list[Path]:
    """What the extension runs: what the wheel installs (pyproject.toml's modules and data), relative to ROOT."""
    return sorted({path.relative_to(ROOT) for pattern in shipped() for path in ROOT.glob(pattern)})


def install_dependencies(lib: Path, platform: str | None, python_version: str | None) -> None:
    target = (["--platform", platform, "--only-binary=:all:"] if platform else []) + (
        ["--python-version", python_version, "--only-binary=:all:"] if python_version else [])
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
                    str(lib), "-r", str(ROOT / "requirements.txt"), *dict.fromkeys(target)], check=True)


def build(out: Path, deps: bool = True, platform: str | None = None, python_version: str | None = None) -> Path:
    manifest = json.loads(MANIFEST.read_text())
    name = f"{manifest['name']}-{manifest['version']}" + (f"-{platform}" if platform else "")
    with tempfile.TemporaryDirectory() as folder:
        stage = Path(folder)
        shutil.copy(MANIFEST, stage / "manifest.json")
        shutil.copy(MANIFEST.parent / manifest["icon"], stage / manifest["icon"])
        for relative in server_files():
            (stage / "server" / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / relative, stage / "server" / relative)
        if deps:
            install_dependencies(stage / "server" / "lib", platform, python_version)
        out.mkdir(parents=True, exist_ok=True)
        bundle = out / f"{name}.mcpb"
        with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(p for p in stage.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                archive.write(path, path.relative_to(stage).as_posix())
    return bundle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the Claude Desktop extension (.mcpb).")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the .mcpb goes (default dist/)")
    parser.add_argument("--no-deps", action="store_true", help="leave out server/lib (the dependencies)")
    parser.add_argument("--platform", help="pip's --platform for the dependencies, e.g. macosx_11_0_arm64")
    parser.add_argument("--python-version", help="pip's --python-version for the dependencies, e.g. 3.12")
    args = parser.parse_args(argv)
    print(build(args.out, deps=not args.no_deps, platform=args.platform, python_version=args.python_version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
