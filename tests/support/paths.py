"""Where things are, whichever folder of tests/ a module sits in: the repository's root (the folder that holds
pyproject.toml, found upwards, so moving a module never changes what `ROOT` means) and the Spark scripts of the
tests."""

from pathlib import Path

ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "pyproject.toml").is_file())
SPARK_SCRIPTS = ROOT / "tests/tasks/spark_scripts"
