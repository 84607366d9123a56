"""The Python side of our Gardener checker (testenv/gardener/gardener_types.py) and of building it from
Gardener's tree (testenv/base/binaries.py, testenv/gardener/grm.py): what it makes of the checker's answers,
the chart archive it hands over, the nested modules it fetches. The checker itself runs in
tests/integration/test_gardener_types.py."""

from __future__ import annotations

import json

import pytest

from testenv.base import binaries
from testenv.gardener import gardener_types, grm
from testenv.gardener.seed_objects import module_crds


def test_answers_are_one_string_per_object() -> None:
    assert gardener_types.parse_answers('["", "observed generation outdated (1/2)"]\n', 2) == [
        "",
        "observed generation outdated (1/2)",
    ]


@pytest.mark.parametrize(
    ("stdout", "says"),
    [
        ('["", ""]', "answered 2 for 3 objects"),
        ('{"a": 1}', "not a list of strings"),
        ("[1, 2, 3]", "not a list"),
    ],
)
def test_an_answer_that_does_not_fit_the_question_is_an_error(stdout: str, says: str) -> None:
    with pytest.raises(RuntimeError, match=says):
        gardener_types.parse_answers(stdout, 3)


def test_a_rendered_chart_is_its_objects_in_file_order() -> None:
    files = {
        "chart_templates_service.yaml": "apiVersion: v1\nkind: Service\nmetadata:\n  name: b\n",
        "chart_templates_deployment.yaml": "---\n# empty\n---\napiVersion: apps/v1\nkind: Deployment\n"
        "metadata:\n  name: a\n",
    }
    rendered = gardener_types.parse_rendered(json.dumps({"files": files, "values": {"gardener": {}}}))
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered.objects()] == [
        ("Deployment", "a"),
        ("Service", "b"),
    ]
    assert rendered.values == {"gardener": {}}


def test_a_render_answer_without_files_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not files and values"):
        gardener_types.parse_rendered('{"manifest": ""}')


GO_MOD = """module github.com/gardener/gardener

require github.com/gardener/gardener/pkg/apis v0.0.0

replace github.com/gardener/gardener/pkg/apis => ./pkg/apis

replace github.com/elsewhere/x v1.0.0 => ./third_party/x

replace github.com/upstream/y => github.com/fork/y v1.2.3
"""


def test_the_nested_modules_are_the_replaces_by_a_path_of_the_tree() -> None:
    assert binaries.nested_replaces(GO_MOD) == [
        ("github.com/gardener/gardener/pkg/apis", "pkg/apis"),
        ("github.com/elsewhere/x", "third_party/x"),
    ]


def test_a_crd_the_tree_is_not_read_for_is_an_error_naming_those_it_is() -> None:
    with pytest.raises(KeyError, match=r"\['Shoot'\].*'Extension', 'Machine', 'ManagedResource'"):
        module_crds("Extension", "Shoot")
    assert grm.SEED_CRDS["Extension"].endswith("extensions.gardener.cloud_extensions.yaml")
