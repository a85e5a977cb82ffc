"""Each built-in format is declared once, by its factory class: the registry, the ``cdc-*`` sources, the
``pyspark_cdc_*`` shims in connectors/shims and pyproject.toml's ``py-modules`` must all agree with it
(docs/formats.md, "Adding a format")."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

from cdcflow.connectors.spark import sources
from cdcflow.formats.registry import _BUILTIN, FormatFactory, builtin_factories, resolve_format

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "connectors" / "shims"
FACTORIES = builtin_factories()


def declared_shims() -> dict[str, type[FormatFactory]]:
    return {sources.shim_module(factory.spark_source): factory for factory in FACTORIES}


def test_each_registration_names_its_factory() -> None:
    assert [factory.name for factory in FACTORIES] == list(_BUILTIN)
    assert all(factory.options.prefix == factory.name for factory in FACTORIES)


def test_names_aliases_and_sources_are_unique() -> None:
    names = [name for factory in FACTORIES for name in (factory.name, *factory.aliases)]
    assert len(names) == len(set(names)), names
    spark_sources = [factory.spark_source for factory in FACTORIES]
    assert len(spark_sources) == len(set(spark_sources)), spark_sources
    # Spark's own sources (kafka, json, ...) keep their names: ours all start with cdc-.
    assert all(source.startswith("cdc-") for source in spark_sources), spark_sources


@pytest.mark.parametrize("factory", FACTORIES, ids=[f.name for f in FACTORIES])
def test_aliases_resolve_to_their_format(factory: type[FormatFactory]) -> None:
    for name in (factory.name, *factory.aliases):
        assert type(resolve_format(name)) is factory
        assert sources.source_names()[name] == factory.spark_source


def test_every_declared_source_has_its_shim_and_no_other_shim_exists() -> None:
    on_disk = {path.stem for path in SHIMS.glob("pyspark_*.py")}
    assert on_disk == set(declared_shims())


def test_pyproject_installs_exactly_the_shims() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert sorted(pyproject["tool"]["setuptools"]["py-modules"]) == sorted(declared_shims())


@pytest.mark.parametrize("module", sorted(declared_shims()))
def test_each_shim_exposes_its_formats_source(module: str) -> None:
    factory = declared_shims()[module]
    source = importlib.import_module(module).DefaultSource
    assert source.name() == factory.spark_source
    assert source.format_name == factory.name
    assert getattr(sources, source.__name__) is source  # Spark pickles it by reference


def test_the_sources_are_the_declared_ones() -> None:
    assert [(s.format_name, s.name()) for s in sources.SOURCES] == [
        (factory.name, factory.spark_source) for factory in FACTORIES
    ]
    assert sources.source_formats() == {factory.spark_source: factory.name for factory in FACTORIES}
