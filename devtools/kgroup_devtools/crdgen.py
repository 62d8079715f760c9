"""Render the ConsumerGroup CRD from the pydantic models in :mod:`kgroup.crd_models`.

Rule: the CRD is never edited by hand. ``python -m kgroup_devtools.crdgen --write`` renders
``crds/kgroup.dev_consumergroups.yaml``; ``--check`` exits 1 with a diff when the file
on disk drifts from the models (CI runs it, and a unit test does the same).

Why generate: the operator and the sidecar read the resource through the models, and the
API server validates it through the CRD's schema; if the two disagree, a spec the API
server accepts could crash the operator (or the reverse). So the field names, types,
bounds, enums and defaults come from the models, and only what pydantic cannot say
(CEL rules with their messages, list-map keys, size caps, descriptions) is added here in
:data:`SCHEMA_OVERLAY`, keyed by field path. Once those bits move into the models'
``json_schema_extra`` the overlay can shrink to nothing; the generator already carries
``json_schema_extra`` through.

Conversion from pydantic's JSON schema to a Kubernetes *structural* schema: ``$ref`` is
inlined, ``title`` dropped, ``X | None`` becomes ``X`` (the models never send null:
``to_wire`` excludes None), ``dict[str, Any]`` becomes an object with
``x-kubernetes-preserve-unknown-fields``, a one-value ``Literal`` (``const``) an enum of one,
and defaults that pydantic leaves out (those of
``default_factory``) are filled in from the models, so the API server defaults exactly
what the models default.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter

from kgroup import crd_models as api
from kgroup.constants import API_GROUP, API_VERSION, CRD_NAME, KIND, PLURAL, SHORT_NAME
from kgroup_devtools.crd_docs import DESCRIPTIONS

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / f"{API_GROUP}_{PLURAL}.yaml"

Schema = dict[str, Any]

# Partition ranges ("0-3,7,9-12"): numbers of at most 9 digits (so CEL's int() and the
# readers never meet an overflow; the rules below and the readers compare them with
# spec.partitions), and at most _RANGES_MAX_CHARS characters: every other partition of
# 100,000 listed one by one ("0,2,4,...") takes 288,894, the longest a real target can be.
# The shape is checked by CEL rules with a message a person reads, not by an
# OpenAPI ``pattern``, whose refusal quotes the regular expression: on stalledPartitions
# (one string) in the CRD; on status.assignment and status.members[].assigned in the
# chart's status policy (a CRD rule there would be estimated at maxProperties x
# maxLength; a policy is charged what it reads). The readers never trust the shape
# anyway (kgroup.core.ranges.parse_ranges is bounded; the operator repairs a bad status).
_RANGES_PATTERN = r"^([0-9]{1,9}(-[0-9]{1,9})?(,[0-9]{1,9}(-[0-9]{1,9})?)*)?$"
_RANGES_MAX_CHARS = 300_000
_LAST_NUMBER = "find('[0-9]+$')"
_RANGES_SHAPE = f"self.matches('{_RANGES_PATTERN}')"
# every partition number is below this: status.layout's nextPartition (a reshaped group
# numbers new partitions upwards), else spec.partitions
_BOUND = ("(has(self.status.layout) ? self.status.layout.nextPartition"
          " : self.spec.partitions)")
# Rules on the whole object (they see spec and status; they run on status writes too).
# Only a rule whose estimated cost is bounded fits (StaticEstimatedCostLimit 10^7 per
# rule): stalledPartitions is one string, so comparing its last (largest, the writers
# sort) number with spec.partitions costs ~0.2 per character. The same check over
# status.assignment would be estimated at maxProperties x maxLength (10^4 x 3*10^5):
# it lives in the chart's status admission policy instead (docs/design.md).
# The Append rule reads status.layout's generations (at most 8) on a spec change only.
_APPEND_LAYOUT = ("!has(self.status) || !has(self.status.layout)"
                  " || (size(self.status.layout.generations) == 1"
                  " && self.status.layout.generations[0].placement == 'modulo')")
ROOT_VALIDATIONS: list[Schema] = [
    {
        "rule": "self.spec.reshape.policy != 'Append'"
                " || self.spec.partitions == oldSelf.spec.partitions"
                f" || {_APPEND_LAYOUT}",
        "message": "spec.partitions cannot change under spec.reshape.policy Append while "
                   "status.layout is not one modulo generation (crc32 % partitions): an "
                   "earlier reshape placed keys by ranges, or one is under way; keep "
                   "spec.reshape.policy: Generations for this group",
        "fieldPath": ".spec.partitions",
        "reason": "FieldValueForbidden",
    },
    {
        "rule": "!has(self.status) || !has(self.status.stalledPartitions)"
                " || size(self.status.stalledPartitions) == 0"
                f" || !self.status.stalledPartitions.matches('{_RANGES_PATTERN}')"
                f" || int(self.status.stalledPartitions.{_LAST_NUMBER}) < {_BOUND}",
        "messageExpression": "'status.stalledPartitions names partition %s but the group"
                             " numbers its partitions below %d'.format([self.status."
                             f"stalledPartitions.{_LAST_NUMBER}, {_BOUND}])",
        "message": "status.stalledPartitions names a partition the group does not have",
        "fieldPath": ".status.stalledPartitions",
        "reason": "FieldValueInvalid",
    },
]

_MAX_MEMBERS_MESSAGE = (
    "'spec.autoscaling.maxMembers (%d) must be at most spec.partitions (%d): a member "
    "beyond the partitions would hold nothing'.format([self.autoscaling.maxMembers,"
    " self.partitions])"
)
_MIN_MAX_MESSAGE = (
    "'spec.autoscaling.minMembers (%d) must be at most maxMembers (%d)'"
    ".format([self.minMembers, self.maxMembers])"
)

# Extra schema keys per field path ("spec.lease", "status.members[]" for list items).
# Each entry is merged into the generated node; a path that does not exist is an error.
# These belong in kgroup/crd_models.py (json_schema_extra / Field(description=...)) in time.
SCHEMA_OVERLAY: dict[str, Schema] = {
    "spec.partitions": {
        "description": "Number of partitions; a change is a reshape (status.layout).",
    },
    "spec": {
        "description": "What the group consumes and how partitions are assigned.",
        "x-kubernetes-validations": [
            {  # a transition rule (oldSelf): checked on updates only
                "rule": "self.reshape.policy != 'Append' || "
                        "self.partitions >= oldSelf.partitions",
                "messageExpression": "'spec.partitions cannot shrink (from %d to %d) under "
                                     "spec.reshape.policy Append: its producers place keys "
                                     "by crc32 mod partitions and the partitions cut off "
                                     "would never be read to their end; set "
                                     "spec.reshape.policy: Generations to shrink through a "
                                     "reshape'.format([oldSelf.partitions, self.partitions])",
                "message": "spec.partitions cannot shrink under spec.reshape.policy Append; "
                           "set spec.reshape.policy: Generations to shrink through a reshape",
                "fieldPath": ".partitions",
                "reason": "FieldValueForbidden",
            },
            {
                "rule": "!has(self.autoscaling) || self.autoscaling.maxMembers <= "
                        "self.partitions",
                "messageExpression": _MAX_MEMBERS_MESSAGE,
                "message": "spec.autoscaling.maxMembers must be at most spec.partitions: "
                           "a member beyond the partitions would hold nothing",
                "fieldPath": ".autoscaling.maxMembers",
                "reason": "FieldValueInvalid",
            }
        ],
    },
    "spec.reshape": {
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.change) || self.policy == 'Generations'",
                "message": "spec.reshape.change (a split or a merge) needs "
                           "spec.reshape.policy: Generations: it makes a new generation",
                "fieldPath": ".change",
                "reason": "FieldValueForbidden",
            }
        ],
    },
    "spec.reshape.change": {
        "x-kubernetes-validations": [
            {
                "rule": "has(self.split) != has(self.merge)",
                "message": "spec.reshape.change takes one split (a partition number) or "
                           "one merge (two adjacent partition numbers), not both or neither",
                "reason": "FieldValueInvalid",
            },
            {
                "rule": "!has(self.merge) || self.merge[0] != self.merge[1]",
                "message": "spec.reshape.change.merge names two different partitions",
                "fieldPath": ".merge",
                "reason": "FieldValueInvalid",
            },
        ],
    },
    "spec.autoscaling": {
        "x-kubernetes-validations": [
            {
                "rule": "self.minMembers <= self.maxMembers",
                "messageExpression": _MIN_MAX_MESSAGE,
                "message": "spec.autoscaling.minMembers must be at most maxMembers",
                "fieldPath": ".minMembers",
                "reason": "FieldValueInvalid",
            }
        ],
    },
    "spec.selector": {
        "description": "Label selector of the member pods (metav1.LabelSelector).",
        "x-kubernetes-validations": [
            {
                "rule": "size(self.matchLabels) > 0 || size(self.matchExpressions) > 0",
                "message": "selector must select something: give matchLabels or matchExpressions",
            }
        ],
    },
    "spec.selector.matchLabels": {"maxProperties": 64},
    "spec.selector.matchExpressions": {"maxItems": 64},
    "spec.selector.matchExpressions[].key": {"minLength": 1, "maxLength": 317},
    "spec.selector.matchExpressions[].values": {"maxItems": 256},
    "spec.assignor": {"description": "sticky (minimum movement) or range (contiguous)."},
    "spec.stabilizationWindowSeconds": {
        "description": "Membership must be quiet this long before a rebalance."
    },
    "spec.stabilizationMaxDelaySeconds": {
        "description": "Rebalance at most this long after the first membership change."
    },
    "spec.lease": {
        "description": "Session lease of each member.",
        "x-kubernetes-validations": [
            {
                "rule": "self.renewIntervalSeconds < self.durationSeconds",
                "message": "lease.renewIntervalSeconds must be less than lease.durationSeconds",
            }
        ],
    },
    "spec.handoff.drainTimeoutSeconds": {
        "description": "Longest a revoking partition waits for the application."
    },
    "spec.restartGraceSeconds": {
        "description": "A member back under the same name within this keeps its partitions "
        "(not a Deployment's pod once deleted: its name never comes back)."
    },
    "spec.statefulSetRestartGraceSeconds": {
        "description": "The same grace for pods of a StatefulSet (the larger of the two)."
    },
    "spec.paused": {"description": "Freeze the target assignment."},
    "spec.source": {"description": "Opaque; passed to the workers (stream, redis URL, ...)."},
    "status": {"description": "Written by the operator only, through the status subresource."},
    "status.observedGeneration": {"minimum": 0},
    "status.epoch": {"minimum": 0, "description": "Bumped only when the target changes."},
    "status.memberCount": {"minimum": 0},
    "status.unowned": {"minimum": 0, "description": "Partitions with no live holder."},
    "status.assignment": {
        "maxProperties": 10000,
        "description": "Target assignment: member (pod name) -> compact ranges.",
    },
    "status.assignment{}": {"maxLength": _RANGES_MAX_CHARS},
    "status.stalledPartitions": {
        "maxLength": _RANGES_MAX_CHARS,
        "x-kubernetes-validations": [{
            "rule": _RANGES_SHAPE,
            "message": "status.stalledPartitions must be partition ranges such as 0-3,7,9-12: "
                       "numbers of at most 9 digits, a dash between the ends of a range, "
                       "commas between ranges",
            "reason": "FieldValueInvalid",
        }],
    },
    "status.members": {
        "maxItems": 10000,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    },
    "status.members[].name": {"minLength": 1, "maxLength": 253},
    "status.members[].assigned": {"maxLength": _RANGES_MAX_CHARS},
    "status.members[].assignedCount": {"minimum": 0},
    "status.members[].ownedCount": {"minimum": 0},
    "status.members[].acknowledgedEpoch": {"minimum": 0},
    "status.sidecarMissing.count": {"minimum": 0},
    "status.sidecarMissing.pods": {"maxItems": api.SIDECAR_MISSING_LISTED},
    "status.sidecarMissing.pods[]": {"maxLength": 253},
    "status.lastRebalance.epoch": {"minimum": 0},
    "status.lastRebalance.moved": {"minimum": 0},
    "status.lastRebalance.durationSeconds": {"minimum": 0},
    "status.conditions": {
        "maxItems": 16,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    },
    "status.conditions[].type": {"minLength": 1, "maxLength": 316},
    "status.conditions[].reason": {"minLength": 1, "maxLength": 1024},
    "status.conditions[].message": {"maxLength": 32768},
    "status.conditions[].observedGeneration": {"minimum": 0},
}

PRINTER_COLUMNS: list[Schema] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.epoch"},
    {"name": "Generation", "type": "integer", "jsonPath": ".status.layout.generation"},
    {"name": "Partitions", "type": "integer", "jsonPath": ".spec.partitions"},
    {"name": "Members", "type": "integer", "jsonPath": ".status.memberCount"},
    {"name": "Unowned", "type": "integer", "jsonPath": ".status.unowned"},
    {"name": "Stalled", "type": "integer", "jsonPath": ".status.stalled"},
    {"name": "Recommended", "type": "integer",
     "jsonPath": ".status.load.recommendedMembers"},
    # -o wide: running pods labelled with the group that have no sidecar (absent: none)
    {"name": "Without-Sidecar", "type": "integer", "jsonPath": ".status.sidecarMissing.count",
     "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _inline(node: Any, defs: dict[str, Schema]) -> Any:
    """Resolve ``$ref``, drop titles, turn pydantic's JSON schema into a structural one."""
    if isinstance(node, list):
        return [_inline(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **extra}, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _inline({**branches[0], **rest}, defs)
    out: Schema = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "default" and value is None:
            continue
        if key == "const":  # a one-value Literal: structural schemas know enum, not const
            out["enum"] = [value]
            continue
        if key == "additionalProperties" and value is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
            continue
        if key == "properties":
            out[key] = {name: _inline(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _inline(value, defs)
    return out


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model class, is_list) for ``M``, ``M | None`` and ``list[M]`` annotations."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _nested_model(args[0]) if len(args) == 1 else (None, False)
    if origin is list:
        inner, _ = _nested_model(typing.get_args(annotation)[0])
        return inner, True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _fill_factory_defaults(model: type[BaseModel], schema: Schema) -> None:
    """Add the defaults of ``default_factory`` fields, which pydantic's schema omits."""
    props = schema.get("properties", {})
    for name, field in model.model_fields.items():
        alias = field.alias or name
        sub = props[alias]
        if field.default_factory is not None and "default" not in sub:
            value = field.get_default(call_default_factory=True)
            sub["default"] = TypeAdapter[Any](typing.cast(Any, field.annotation)).dump_python(
                value, by_alias=True, mode="json", exclude_none=True
            )
        inner, is_list = _nested_model(field.annotation)
        if inner is not None:
            _fill_factory_defaults(inner, sub["items"] if is_list else sub)


CEL_KEY = "x-kubernetes-validations"
_KEY_ORDER = ["description", "type", "format", "enum", "default", "required"]


def _ordered(node: Any) -> Any:
    """Schema keys in a reading order: description, type, ..., then the rest sorted."""
    if isinstance(node, list):
        return [_ordered(x) for x in node]
    if not isinstance(node, dict):
        return node
    first = [k for k in _KEY_ORDER if k in node]
    rest = sorted(k for k in node if k not in _KEY_ORDER)
    out: Schema = {}
    for key in first + rest:
        value = node[key]
        if key == "properties":
            out[key] = {name: _ordered(sub) for name, sub in value.items()}
        elif key in ("default", "enum", "required", "x-kubernetes-list-map-keys", CEL_KEY):
            out[key] = value
        else:
            out[key] = _ordered(value)
    return out


def model_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI schema of one model, defaults included."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: Schema = _inline(raw, raw.get("$defs", {}))
    _fill_factory_defaults(model, schema)
    return schema


def _node(root: Schema, path: str) -> Schema:
    """The schema node at a dotted path; ``x[]`` steps into items, ``x{}`` into values."""
    node = root
    for step in path.split("."):
        suffix = ""
        if step.endswith("[]") or step.endswith("{}"):
            step, suffix = step[:-2], step[-2:]
        try:
            node = node["properties"][step]
        except KeyError:
            raise KeyError(f"schema overlay path {path!r}: no field {step!r}") from None
        if suffix == "[]":
            node = node["items"]
        elif suffix == "{}":
            node = node["additionalProperties"]
    return node


def apply_overlay(root: Schema, overlay: dict[str, Schema]) -> Schema:
    """A copy of `root` with each overlay entry merged into the node at its path."""
    out = copy.deepcopy(root)
    for path, extra in overlay.items():
        _node(out, path).update(copy.deepcopy(extra))
    return out


def openapi_schema() -> Schema:
    """The ``openAPIV3Schema`` of the ConsumerGroup."""
    root: Schema = {
        "type": "object",
        "description": "A consumer group: partitions of a stream shared among member pods.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": model_schema(api.ConsumerGroupSpec),
            "status": model_schema(api.ConsumerGroupStatus),
        },
    }
    described = apply_overlay(apply_overlay(root, SCHEMA_OVERLAY), DESCRIPTIONS)
    described[CEL_KEY] = copy.deepcopy(ROOT_VALIDATIONS)
    ordered: Schema = _ordered(described)
    return ordered


def crd() -> Schema:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["kgroup"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def _integral(node: Any) -> Any:
    """Integral floats as ints (a default of 2.0 as 2): the chart installs the CRD through
    helm's fromYaml/toYaml, which writes 2.0 as 2, and the installed CRD must be this one."""
    if isinstance(node, float) and node.is_integer():
        return int(node)
    if isinstance(node, dict):
        return {k: _integral(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_integral(v) for v in node]
    return node


def render() -> str:
    """The CRD as YAML text, exactly as checked in."""
    header = ("# Generated by `python -m kgroup_devtools.crdgen --write` from "
              "kgroup/crd_models.py. Do not edit.\n")
    body = yaml.safe_dump(_integral(crd()), sort_keys=False, width=100,
                          default_flow_style=False)
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kgroup_devtools.crdgen", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write {CRD_PATH.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff on drift")
    mode.add_argument("--print", action="store_true", help="print the CRD to stdout")
    parser.add_argument("--path", type=Path, default=CRD_PATH, help="the CRD file")
    args = parser.parse_args(argv)
    text = render()
    if args.print:
        sys.stdout.write(text)
        return 0
    if args.write:
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(text)
        print(f"wrote {args.path}")
        return 0
    on_disk = args.path.read_text() if args.path.exists() else ""
    if on_disk == text:
        return 0
    diff = difflib.unified_diff(
        on_disk.splitlines(keepends=True),
        text.splitlines(keepends=True),
        fromfile=f"{args.path} (checked in)",
        tofile=f"{args.path} (generated)",
    )
    sys.stderr.writelines(diff)
    print(f"\n{args.path} is out of date: run `python -m kgroup_devtools.crdgen --write`",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
