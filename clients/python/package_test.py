#!/usr/bin/python3
"""CTest python_package_test: pip-installs the staged dlrm_client package
into a fresh virtual environment (offline: --no-index --no-build-isolation,
its dependencies from Debian's python3-grpcio, -protobuf, -numpy through
--system-site-packages), then runs package_check.py with the venv's python
and no PYTHONPATH: a real dlrm_server (tiny), examples/notebook_style.py,
and the client's API.

    package_test.py PACKAGE_DIR SERVER_BINARY

Exits 77 (CTest: skipped) when venv or ensurepip is missing
(Debian: apt-get install python3-venv).
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def main(package_dir, server_binary):
    try:
        import ensurepip  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        import venv  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as e:
        print("SKIP: no venv/ensurepip (%s); install python3-venv" % e)
        return SKIP
    if not os.path.isfile(os.path.join(package_dir, "pyproject.toml")):
        print("FAIL: %s is not the staged package (build dlrm_python_package)"
              % package_dir)
        return 1
    tmp = tempfile.mkdtemp(prefix="dlrm_package_test_")
    try:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTHON") and k != "PIP_INDEX_URL"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        venv_dir = os.path.join(tmp, "venv")
        result = subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", venv_dir],
            env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            if "ensurepip" in result.stdout + result.stderr:
                print("SKIP: venv cannot install pip (python3-venv "
                      "missing?):\n" + result.stdout + result.stderr)
                return SKIP
            print("FAIL: venv:\n" + result.stdout + result.stderr)
            return 1
        python = os.path.join(venv_dir, "bin", "python")
        # pip builds in the source directory: give it a copy.
        source = os.path.join(tmp, "src")
        shutil.copytree(package_dir, source,
                        ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                      "__pycache__"))
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--no-index",
             "--no-build-isolation", "--no-cache-dir", source],
            env=env, check=True, cwd=tmp)
        shutil.rmtree(source)
        # Run from a copy: next to its source, the script's directory
        # would put the uninstalled dlrm_client on sys.path.
        check = os.path.join(tmp, "package_check.py")
        shutil.copy(os.path.join(HERE, "package_check.py"), check)
        return subprocess.run(
            [python, check, server_binary,
             os.path.join(HERE, "examples", "notebook_style.py")],
            env=env, check=False, cwd=tmp).returncode
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
