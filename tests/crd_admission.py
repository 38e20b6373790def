"""What the API server checks when a CustomResourceDefinition is created, for CRDs no API
server here can create. Each rule names the upstream function it follows, in
k8s.io/apiextensions-apiserver at 1aa2717 (2026-07-22) unless another repository is named:

| upstream                                                           | here                       |
|--------------------------------------------------------------------|----------------------------|
| pkg/apiserver/schema/validation.go `validateStructuralInvariants`  | `_structural`              |
| (a type on every node, items on arrays, nothing at the root but    |                            |
| type object, root `metadata` restricted to name and generateName)  |                            |
| pkg/apis/apiextensions/validation/validation.go                    | `_openapi`                 |
| `ValidateCustomResourceDefinitionOpenAPISchema` (properties and    |                            |
| additionalProperties exclusive, uniqueItems, list and map types,   |                            |
| the rule, message, reason and fieldPath of x-kubernetes-validations|                            |
| and oldSelf only where old and new values correlate)               |                            |
| the same file, `specStandardValidatorV3.validate` (defaults valid  | `_defaults`                |
| against their node, none under the root metadata)                  |                            |
| pkg/apiserver/schema/cel/validation.go `ValidFieldPath`            | `valid_field_path`         |
| pkg/apiserver/schema/cel/compilation.go `Compile` (every field a   | `_Rule`: a rule's walk     |
| rule reads declared; k8s.io/apiserver pkg/cel/environment/base.go  |                            |
| the functions of the Kubernetes CEL environment)                   |                            |
| validation.go `StaticEstimatedCostLimit` (10,000,000 a rule) and   | `_Rule.cost`, `problems`   |
| `StaticEstimatedCRDCostLimit` (100,000,000 a CRD); a rule's cost   |                            |
| times the most times it runs (`getExpressionCost`)                 |                            |

The cost is a conservative stand-in for cel-go's estimator (checker/cost.go): 1 for every
node of the expression; a string compared, searched or prefixed costs its maxLength (cel-go:
a tenth of it); `matches` costs maxLength times the pattern's length (cel-go: a tenth times
a quarter); a macro over a list costs maxItems times its body, plus 1 a step; a rule runs
once for each element of every list and map above it (maxItems, maxProperties; unbounded:
the API server's 3 MiB request over the smallest element, 3 bytes). A rule that reads a
string, list or map without a bound is reported by name, since the API server would then
price it at 3 MiB and the budgets would be spent by the schema rather than by the rule.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import celpy
import jsonschema
import lark
import re2

from streamrl.operator.validate import to_jsonschema

PER_RULE_LIMIT = 10_000_000
"""validation.go StaticEstimatedCostLimit."""
PER_CRD_LIMIT = 100_000_000
"""validation.go StaticEstimatedCRDCostLimit."""
MAX_REQUEST_BYTES = 3 * 1024 * 1024
"""The API server's request size limit: what an unbounded string, list or map is priced at."""
UNBOUNDED_CARDINALITY = MAX_REQUEST_BYTES // 3
"""compilation.go maxCardinality: the 3 MiB request limit over the smallest element ("{}," is 3 bytes)."""
REASONS = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")
"""validation.go supportedValidationReason."""

# k8s.io/apiserver pkg/cel/environment/base.go: the standard definitions, then the libraries the
# base environment adds (library.URLs, Regex, Lists, Authz, Quantity, IP, CIDR, Format,
# AuthzSelectors, SemverLib; cel-go ext.Strings v2, Sets, TwoVarComprehensions, Lists v3,
# OptionalTypes). Global functions, then receiver-style ones.
GLOBAL_FUNCTIONS = frozenset({
    "has", "size", "int", "uint", "double", "string", "bytes", "bool", "duration", "timestamp", "type", "dyn",
    "matches", "url", "isURL", "quantity", "isQuantity", "ip", "isIP", "cidr", "isCIDR", "semver", "isSemver",
    "format",
})
NAMESPACED_FUNCTIONS = frozenset({
    "sets.contains", "sets.equivalent", "sets.intersects", "strings.quote", "lists.range", "optional.of",
    "optional.none", "optional.ofNonZeroValue", "format.named", "ip.isCanonical",
})
MEMBER_FUNCTIONS = frozenset({
    # standard
    "matches", "startsWith", "endsWith", "contains", "size", "getDate", "getDayOfMonth", "getDayOfWeek",
    "getDayOfYear", "getFullYear", "getHours", "getMilliseconds", "getMinutes", "getMonth", "getSeconds",
    # ext.Strings v2
    "charAt", "indexOf", "lastIndexOf", "lowerAscii", "upperAscii", "replace", "split", "substring", "trim",
    "join", "reverse", "format",
    # library.Lists, ext.Lists v3
    "isSorted", "sum", "min", "max", "distinct", "flatten", "slice", "sort", "sortBy", "first", "last",
    # library.Regex
    "find", "findAll",
    # library.URLs
    "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath", "getQuery",
    # library.Quantity, SemverLib
    "isInteger", "asInteger", "asApproximateFloat", "sign", "add", "sub", "isGreaterThan", "isLessThan",
    "compareTo", "major", "minor", "patch",
    # library.IP, library.CIDR
    "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast", "isGlobalUnicast",
    "containsIP", "containsCIDR", "masked", "prefixLength", "ip",
    # library.Format, library.Authz (only on request objects; listed for completeness)
    "validate", "check", "allowed", "reason", "errored", "error",
    # cel.OptionalTypes
    "hasValue", "value", "orValue", "or", "optMap", "optFlatMap",
})
MACROS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter", "transformList", "transformMap",
                    "transformMapEntry"})
STRING_SCANS = frozenset({"startsWith", "endsWith", "contains", "indexOf", "lastIndexOf", "lowerAscii",
                          "upperAscii", "replace", "split", "substring", "trim", "reverse", "find", "findAll"})


@dataclass(frozen=True)
class _T:
    """What a CEL expression's value is, as far as the schema says."""

    kind: str
    """object, map, list, string, scalar, dyn."""
    schema: dict | None = None
    where: str = ""
    """The schema path it comes from ("" for literals and results)."""
    size: float = 0
    """maxLength of a string, maxItems or maxProperties of a list or map; math.inf unbounded."""

    @staticmethod
    def of(node: dict | None, where: str) -> _T:
        if node is None or node.get("x-kubernetes-int-or-string"):
            return _T("dyn", node, where)
        kind = node.get("type")
        if kind == "object":
            if "properties" in node:
                return _T("object", node, where)
            if isinstance(node.get("additionalProperties"), dict):
                return _T("map", node, where, node.get("maxProperties", math.inf))
            return _T("dyn", node, where)  # preserve-unknown-fields: its fields are not declared to CEL
        if kind == "array":
            return _T("list", node, where, node.get("maxItems", math.inf))
        if kind == "string":
            if "enum" in node:
                return _T("string", node, where, max(len(str(v)) for v in node["enum"]))
            return _T("string", node, where, node.get("maxLength", math.inf))
        return _T("scalar", node, where)


def _literal(token: lark.Token) -> _T:
    if token.type in ("STRING_LIT", "MLSTRING_LIT"):
        return _T("string", size=len(token) - 2)
    return _T("scalar")


@dataclass
class _Rule:
    """One rule compiled against the schema node it sits on: the fields it reads, the functions
    it calls, its cost, and whether it reads oldSelf."""

    node: dict
    where: str
    errors: list[str] = field(default_factory=list)
    unbounded: list[str] = field(default_factory=list)
    uses_old_self: bool = False
    cost: float = 0

    def compile(self, rule: str) -> _Rule:
        try:
            tree = celpy.CELParser().parse(rule)
        except celpy.CELParseError as err:
            self.errors.append(f"compilation failed: {str(err).splitlines()[0]}")
            return self
        this = _T.of(self.node, self.where)
        self.cost = self._type(tree, {"self": this, "oldSelf": this})[1]
        return self

    def _bound(self, t: _T) -> float:
        """t's size; an unbounded string, list or map a rule reads is reported by where it is declared."""
        if t.size == math.inf:
            if t.where and t.where not in self.unbounded:
                self.unbounded.append(t.where)
            return MAX_REQUEST_BYTES
        return t.size

    def _field(self, base: _T, name: str) -> _T:
        if base.kind == "object":
            props = base.schema["properties"]
            if name not in props:
                self.errors.append(f"compilation failed: ERROR: undefined field '{name}'")
                return _T("dyn")
            return _T.of(props[name], f"{base.where}.properties[{name}]")
        if base.kind == "map":
            return _T.of(base.schema["additionalProperties"], f"{base.where}.additionalProperties")
        if base.kind in ("string", "list", "scalar"):
            self.errors.append(f"compilation failed: ERROR: type '{base.kind}' does not support field selection")
        return _T("dyn")

    def _element(self, t: _T) -> _T:
        if t.kind == "list":
            return _T.of(t.schema["items"], f"{t.where}.items")
        if t.kind == "map":
            return _T("string", size=253)  # a map macro binds the key
        return _T("dyn")

    def _type(self, tree, scope: dict[str, _T]) -> tuple[_T, float]:
        """(type, cost) of a subtree."""
        if isinstance(tree, lark.Token):
            return _T("scalar"), 0
        rule, kids = tree.data, tree.children
        if rule == "ident":
            name = str(kids[0])
            if name not in scope:
                self.errors.append(f"compilation failed: ERROR: undeclared reference to '{name}'")
                return _T("dyn"), 1
            if name == "oldSelf":
                self.uses_old_self = True
            return scope[name], 1
        if rule == "literal":
            return _literal(kids[0]), 1
        if rule == "member_dot":
            base, cost = self._type(kids[0], scope)
            return self._field(base, str(kids[1])), cost + 1
        if rule == "member_index":
            base, cost = self._type(kids[0], scope)
            _, index_cost = self._type(kids[1], scope)
            return self._element(base) if base.kind in ("list", "map") else _T("dyn"), cost + index_cost + 1
        if rule == "ident_arg":
            return self._call(None, str(kids[0]), list(kids[1].children) if len(kids) > 1 else [], scope)
        if rule == "member_dot_arg":
            target = kids[0]
            args = list(kids[2].children) if len(kids) > 2 else []
            namespace = _ident(target)  # `sets` in `sets.contains(...)`, unless a variable of that name
            if namespace is not None and namespace not in scope:
                return self._call(None, f"{namespace}.{kids[1]}", args, scope)
            return self._call(target, str(kids[1]), args, scope)
        if rule in ("relation", "addition", "multiplication") and len(kids) == 2:
            # A binary operator: the parser hangs the left operand under the operator's node.
            op = kids[0].data
            (left, lc), (right, rc) = self._type(kids[0].children[0], scope), self._type(kids[1], scope)
            if op in ("relation_eq", "relation_ne"):
                return _T("scalar"), lc + rc + 1 + self._equality(left, right)
            if op == "relation_in":
                steps = self._bound(right) if right.kind in ("list", "map") else 1
                return _T("scalar"), lc + rc + 1 + steps * (1 + self._equality(left, self._element(right)))
            if op == "addition_add" and left.kind in ("string", "list"):  # concatenation copies both
                return _T(left.kind, size=left.size + right.size), lc + rc + 1 + self._bound(left) + self._bound(right)
            if op.startswith("relation_") and "string" in (left.kind, right.kind):
                return _T("scalar"), lc + rc + 1 + self._equality(left, right)
            return _T("scalar"), lc + rc + 1
        if rule == "expr" and len(kids) == 3:  # the conditional: both branches priced (an upper bound)
            (_, a), (then, b), (other, c) = (self._type(k, scope) for k in kids)
            return (then if then.kind == other.kind else _T("dyn")), a + b + c + 1
        total, last = 0.0, _T("dyn")
        for kid in kids:
            last, cost = self._type(kid, scope)
            total += cost
        if len(kids) == 1 and rule in ("expr", "conditionalor", "conditionaland", "relation", "addition",
                                       "multiplication", "unary", "member", "primary", "paren_expr"):
            return last, total
        return _T("dyn"), total + 1

    def _equality(self, left: _T, right: _T) -> float:
        """The cost of comparing two values (a string's length; a list or object element by element)."""
        if "string" in (left.kind, right.kind):
            sizes = [self._bound(t) for t in (left, right) if t.kind == "string"]
            return min(sizes)
        if left.kind == "list" and right.kind == "list":
            return self._bound(left) * (1 + self._equality(self._element(left), self._element(right)))
        if left.kind == "object" and right.kind == "object" and left.schema is right.schema:
            return sum(1 + self._equality(t, t) for t in
                       (_T.of(s, f"{left.where}.properties[{k}]") for k, s in left.schema["properties"].items()))
        return 1

    def _call(self, target, name: str, args: list, scope: dict[str, _T]) -> tuple[_T, float]:
        if target is None:
            if name == "has":  # a presence test: the field must exist, nothing is read
                if len(args) != 1:
                    self.errors.append("compilation failed: ERROR: invalid argument to has() macro")
                    return _T("scalar"), 1
                _, cost = self._type(args[0], scope)
                return _T("scalar"), cost
            if name not in GLOBAL_FUNCTIONS and name not in NAMESPACED_FUNCTIONS:
                self.errors.append(f"compilation failed: ERROR: undeclared reference to '{name}'")
            typed = [self._type(a, scope) for a in args]
            cost = sum(c for _, c in typed) + 1
            if name == "matches" and len(typed) == 2:
                cost += self._matches(typed[0][0], args[1])
            return (_T("scalar") if name in ("size", "int", "bool", "double", "uint", "has") else _T("dyn")), cost
        base, cost = self._type(target, scope)
        if name in MACROS:
            if not args or _ident(args[0]) is None:
                self.errors.append(f"compilation failed: ERROR: {name}() needs a variable name first")
                return _T("dyn"), cost
            inner = {**scope, _ident(args[0]): self._element(base)}
            body = 0.0
            for arg in args[1:]:
                body += self._type(arg, inner)[1]
            steps = self._bound(base) if base.kind in ("list", "map") else 1
            result = _T("scalar") if name in ("all", "exists", "exists_one", "existsOne") else _T("list", size=steps)
            return result, cost + steps * (body + 1)
        if name not in MEMBER_FUNCTIONS:
            self.errors.append(f"compilation failed: ERROR: found no matching overload for '{name}'")
        typed = [self._type(a, scope) for a in args]
        cost += sum(c for _, c in typed) + 1
        if name == "matches":
            cost += self._matches(base, args[0] if args else None)
        elif name in STRING_SCANS and base.kind == "string":
            cost += self._bound(base)
        elif name in ("join", "sum", "min", "max", "isSorted", "distinct", "sort", "flatten") and base.kind == "list":
            cost += self._bound(base)
        return (_T("scalar") if name != "split" else _T("list")), cost

    def _matches(self, text: _T, pattern) -> float:
        length = _string_literal_length(pattern) if pattern is not None else None
        if length is None:
            self.errors.append("matches() with a pattern that is not a literal cannot be priced")
            return math.inf
        if text.kind == "string":
            return self._bound(text) * max(length, 1)
        return 1


def _descend(tree):
    """The single child chain of a subtree down to its first branching node."""
    while isinstance(tree, lark.Tree) and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree):
        tree = tree.children[0]
    return tree


def _ident(tree) -> str | None:
    leaf = _descend(tree)
    if isinstance(leaf, lark.Tree) and leaf.data == "ident":
        return str(leaf.children[0])
    return None


def _string_literal_length(tree) -> int | None:
    leaf = _descend(tree)
    if isinstance(leaf, lark.Tree) and leaf.data == "literal" and leaf.children[0].type == "STRING_LIT":
        return len(leaf.children[0]) - 2
    return None


def valid_field_path(path: str, node: dict) -> str | None:
    """Why `path` does not name a field under `node`, or None (cel/validation.go ValidFieldPath):
    `.name` and `['name']` steps through declared properties, or any key of an additionalProperties
    map; no list indexes."""
    i = 0
    while i < len(path):
        if path[i] == ".":
            j = i + 1
            while j < len(path) and path[j] not in ".[]":
                j += 1
            name, i = path[i + 1:j], j
            if not name:
                return "unexpected end of JSON path"
        elif path[i] == "[":
            end = path.find("']", i + 2)
            if not path.startswith("['", i) or end < 0:
                return f"expected single quoted string but got {path[i + 1:]}"
            name, i = path[i + 2:end], end + 2
        else:
            return f"expected [ or . but got: {path[i:]}"
        if "properties" in node:
            if name not in node["properties"]:
                return "does not refer to a valid field"
            node = node["properties"][name]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return "does not refer to a valid field"
    return None


@dataclass
class _Walk:
    """One pass over a version's schema, collecting the API server's errors."""

    errors: list[str] = field(default_factory=list)
    total_cost: float = 0
    costs: dict[str, float] = field(default_factory=dict)
    """Each rule's cost times its cardinality, by the rule's field path."""

    def error(self, where: str, kind: str, detail: str, value=None) -> None:
        shown = "" if value is None else f"{_go(value)}: "
        self.errors.append(f"{where}: {kind}: {shown}{detail}")

    def node(self, node: dict, where: str, level: str, cardinality: float, uncorrelatable: str | None) -> None:
        self._structural(node, where, level)
        self._openapi(node, where)
        self._defaults(node, where, False)
        props = node.get("properties") or {}
        for name, sub in props.items():
            if level == "root" and name == "metadata":
                continue  # ObjectMeta: checked by _structural, never walked (its schema is implicit)
            self.node(sub, f"{where}.properties[{name}]", "field", cardinality, uncorrelatable)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            map_type = node.get("x-kubernetes-map-type", "granular")
            self.node(extra, f"{where}.additionalProperties", "field",
                      cardinality * node.get("maxProperties", UNBOUNDED_CARDINALITY),
                      uncorrelatable if map_type == "granular" else uncorrelatable or where)
        if isinstance(node.get("items"), dict):
            correlatable = node.get("x-kubernetes-list-type") == "map"
            self.node(node["items"], f"{where}.items", "item",
                      cardinality * node.get("maxItems", UNBOUNDED_CARDINALITY),
                      uncorrelatable if correlatable else uncorrelatable or where)
        self._rules(node, with_type_and_object_meta(node) if level == "root" else node, where, cardinality,
                    uncorrelatable)

    def _structural(self, node: dict, where: str, level: str) -> None:
        """schema/validation.go validateStructuralInvariants and validateStructuralMetadataInvariants."""
        kind = node.get("type")
        if kind == "array" and "items" not in node:
            self.error(f"{where}.items", "Required value", "must be specified")
        if not kind and not node.get("x-kubernetes-int-or-string") and \
                not node.get("x-kubernetes-preserve-unknown-fields"):
            what = {"root": "at the root", "item": "for specified array items",
                    "field": "for specified object fields"}[level]
            self.error(f"{where}.type", "Required value", f"must not be empty {what}")
        if level == "root":
            if kind and kind != "object":
                self.error(f"{where}.type", "Invalid value", "must be object at the root", kind)
            if "additionalProperties" in node:
                self.error(f"{where}.additionalProperties", "Forbidden", "must not be used at the root")
            props = node.get("properties") or {}
            for name in ("kind", "apiVersion"):
                if name in props and props[name].get("type") != "string":
                    self.error(f"{where}.properties[{name}].type", "Invalid value", "must be string",
                               props[name].get("type"))
            meta = props.get("metadata")
            if meta is not None:
                if meta.get("type") != "object":
                    self.error(f"{where}.properties[metadata].type", "Invalid value", "must be object",
                               meta.get("type"))
                rest = {k: v for k, v in meta.items() if k not in ("type", "default", "properties")}
                extra_props = set(meta.get("properties") or {}) - {"name", "generateName"}
                if rest or extra_props:
                    self.error(f"{where}.properties[metadata]", "Forbidden", "must not specify anything other "
                               "than name and generateName, but metadata is implicitly specified")

    def _openapi(self, node: dict, where: str) -> None:
        """validation.go ValidateCustomResourceDefinitionOpenAPISchema, its schema-shape checks."""
        if node.get("uniqueItems"):
            self.error(f"{where}.uniqueItems", "Forbidden",
                       "uniqueItems cannot be set to true since the runtime complexity becomes quadratic")
        extra = node.get("additionalProperties")
        if extra is not None and node.get("properties") and extra is not True:
            self.error(f"{where}.additionalProperties", "Forbidden",
                       "additionalProperties and properties are mutual exclusive")
        if node.get("x-kubernetes-preserve-unknown-fields") is False:
            self.error(f"{where}.x-kubernetes-preserve-unknown-fields", "Invalid value", "must be true or undefined",
                       False)
        list_type = node.get("x-kubernetes-list-type")
        if list_type is not None and node.get("type") != "array":
            self.error(f"{where}.type", "Invalid value", "must be array if x-kubernetes-list-type is specified",
                       node.get("type"))
        if node.get("x-kubernetes-list-map-keys") and list_type != "map":
            self.error(f"{where}.x-kubernetes-list-type", "Required value",
                       "must be map if x-kubernetes-list-map-keys is non-empty")
        if list_type == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            items = node.get("items") or {}
            if not keys:
                self.error(f"{where}.x-kubernetes-list-map-keys", "Required value",
                           "must not be empty if x-kubernetes-list-type is map")
            for key in keys:
                prop = (items.get("properties") or {}).get(key)
                if prop is None:
                    self.error(f"{where}.x-kubernetes-list-map-keys", "Invalid value",
                               "entries must all be names of item properties", keys)
                elif prop.get("type") in ("array", "object"):
                    self.error(f"{where}.items.properties[{key}].type", "Invalid value",
                               "must be a scalar type if parent array's x-kubernetes-list-type is map", prop["type"])
                # validateMapListKeysMapSet: a key is required or has a default, else items cannot be keyed
                elif key not in (items.get("required") or []) and "default" not in prop:
                    self.error(f"{where}.items.properties[{key}]", "Required value",
                               "this property is in x-kubernetes-list-map-keys, so it must have a default or be a "
                               "required property")
        if "pattern" in node:
            try:
                re2.compile(node["pattern"])
            except re2.error as err:
                self.error(f"{where}.pattern", "Invalid value",
                           f"must be a valid regular expression, but isn't: {err}", node["pattern"])

    def _defaults(self, node: dict, where: str, in_metadata: bool) -> None:
        """specStandardValidatorV3.validate: a default validates against its own node (after
        pruning, which drops unknown fields) and is forbidden in the root metadata."""
        if "default" not in node:
            return
        if in_metadata:
            self.error(f"{where}.default", "Forbidden", "must not be set in top-level metadata")
            return
        node_schema = copy.deepcopy(node)
        node_schema.pop("default")
        errors = list(jsonschema.Draft7Validator(to_jsonschema(node_schema)).iter_errors(node["default"]))
        if errors:
            self.error(f"{where}.default", "Invalid value", errors[0].message, node["default"])

    def _rules(self, node: dict, cel_node: dict, where: str, cardinality: float, uncorrelatable: str | None) -> None:
        """validation.go's x-kubernetes-validations checks against the node as declared (`pathValid`
        reads the structural schema itself), then cel.Compile against the node as CEL sees it
        (`cel_node`: the root with ObjectMeta's name and generateName) and its cost."""
        for i, rule in enumerate(node.get("x-kubernetes-validations") or []):
            at = f"{where}.x-kubernetes-validations[{i}]"
            text = rule.get("rule", "")
            if not text.strip():
                self.error(f"{at}.rule", "Required value", "rule is not specified")
                continue
            message = rule.get("message", "")
            if message and not message.strip():
                self.error(f"{at}.message", "Invalid value", "must be non-empty if specified", message)
            if "\n" in message.strip():
                self.error(f"{at}.message", "Invalid value", "must not contain line breaks", message)
            if "\n" in text.strip() and not message.strip():
                self.error(f"{at}.message", "Required value", "message must be specified if rule contains line breaks")
            if "reason" in rule and rule["reason"] not in REASONS:
                self.error(f"{at}.reason", "Unsupported value", "supported values: " +
                           ", ".join(f'"{r}"' for r in sorted(REASONS)), rule["reason"])
            if "fieldPath" in rule:
                path = rule["fieldPath"]
                if not path.strip():
                    self.error(f"{at}.fieldPath", "Invalid value", "must be non-empty if specified", path)
                elif "\n" in path:
                    self.error(f"{at}.fieldPath", "Invalid value", "must not contain line breaks", path)
                elif valid_field_path(path, node) is not None:
                    self.error(f"{at}.fieldPath", "Invalid value", "must be a valid path", path)
            compiled = _Rule(cel_node, where).compile(text)
            for problem in compiled.errors:
                self.error(f"{at}.rule", "Invalid value", problem, text)
            for unbounded in compiled.unbounded:
                self.error(f"{at}.rule", "Forbidden", f"reads {unbounded}, which has no maxLength, maxItems or "
                           "maxProperties: its estimated cost would be that of a 3 MiB value", text)
            if compiled.uses_old_self and uncorrelatable is not None:
                self.error(f"{at}.rule", "Invalid value",
                           "oldSelf cannot be used on the uncorrelatable portion of the schema within "
                           f"{uncorrelatable}", text)
            cost = compiled.cost * cardinality
            self.costs[f"{at}.rule"] = cost
            self.total_cost += cost
            if cost > PER_RULE_LIMIT:
                self.error(f"{at}.rule", "Forbidden", f"estimated rule cost exceeds budget by factor of "
                           f"{cost / PER_RULE_LIMIT:.2f}x (try simplifying the rule, or adding maxItems, "
                           "maxProperties, and maxLength where arrays, maps, and strings are declared)")


def with_type_and_object_meta(root: dict) -> dict:
    """The root as CEL sees it (cel/model/schemas.go WithTypeAndObjectMeta): kind and apiVersion
    strings, metadata with only name (at most 253 characters, or its declared maxLength if shorter)
    and generateName (252)."""
    props = dict(root.get("properties") or {})
    declared = ((props.get("metadata") or {}).get("properties") or {})
    def capped(name: str, cap: int) -> dict:
        return {"type": "string", "maxLength": min(declared.get(name, {}).get("maxLength", cap), cap)}
    props.update(kind={"type": "string"}, apiVersion={"type": "string"},
                 metadata={"type": "object", "properties": {"name": capped("name", 253),
                                                            "generateName": capped("generateName", 252)}})
    return {**root, "properties": props}


def _go(value) -> str:
    """A value as the API server's field errors quote it."""
    if isinstance(value, str):
        return f'"{value}"'
    return str(value).lower() if isinstance(value, bool) else repr(value)


def schema_walk(crd: dict) -> list[_Walk]:
    """One walk per version of the CRD."""
    walks = []
    for i, version in enumerate(crd["spec"]["versions"]):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        walk = _Walk()
        if schema is None:
            walk.error(f"spec.versions[{i}].schema.openAPIV3Schema", "Required value",
                       "schemas are required")
        else:
            walk.node(schema, f"spec.versions[{i}].schema.openAPIV3Schema", "root", 1, None)
            meta = (schema.get("properties") or {}).get("metadata")
            if meta is not None:
                walk._defaults(meta, f"spec.versions[{i}].schema.openAPIV3Schema.properties[metadata]", True)
        if walk.total_cost > PER_CRD_LIMIT:
            walk.error(f"spec.versions[{i}].schema.openAPIV3Schema", "Forbidden",
                       f"x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds "
                       f"budget by factor of {walk.total_cost / PER_CRD_LIMIT:.2f}x")
        walks.append(walk)
    return walks


def problems(crd: dict) -> list[str]:
    """Every reason the API server would refuse to create `crd`, worded as it words them; [] = created."""
    return [e for walk in schema_walk(crd) for e in walk.errors]


def refusal(crd: dict) -> str | None:
    """The API server's answer to creating `crd` (kubectl prints it), or None when it is created."""
    found = problems(crd)
    if not found:
        return None
    return (f'CustomResourceDefinition.apiextensions.k8s.io "{crd["metadata"]["name"]}" is invalid: ' +
            ("; ".join(found) if len(found) == 1 else "[" + ", ".join(found) + "]"))
