"""Kubernetes RBAC as the API server decides it, for the emulator: a request's attributes
(verb, group, resource, subresource, namespace, name), the rules Roles and bindings grant a
user plus Kubernetes' bootstrap roles, the decision and the 403 the server answers. Follows
k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac (named beside each rule). Knows no kmock
and no chart: it is given the RBAC objects."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

SPECIAL_VERBS = {"proxy", "watch"}
"""requestinfo.go specialVerbs: /api/v1/watch/... (deprecated) names its verb in the path."""
NAMESPACE_SUBRESOURCES = {"status", "finalize"}
"""requestinfo.go namespaceSubresources: /namespaces/<ns>/status is the namespace's own."""
AUTHENTICATED = "system:authenticated"
BOOTSTRAP_CLUSTER_ROLES: dict[str, list[dict]] = {
    # bootstrappolicy/policy.go ClusterRoles(): what every authenticated user may do.
    "system:discovery": [{"verbs": ["get"], "nonResourceURLs": [
        "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
        "/version", "/version/"]}],
    "system:public-info-viewer": [{"verbs": ["get"], "nonResourceURLs": [
        "/healthz", "/livez", "/readyz", "/version", "/version/"]}],
    "system:basic-user": [
        {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
         "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
        {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"]}],
}
BOOTSTRAP_BINDINGS = [  # bootstrappolicy/policy.go ClusterRoleBindings()
    {"kind": "ClusterRoleBinding", "metadata": {"name": role}, "roleRef": {"kind": "ClusterRole", "name": role},
     "subjects": [{"kind": "Group", "name": group} for group in groups]}
    for role, groups in (("system:discovery", [AUTHENTICATED]), ("system:basic-user", [AUTHENTICATED]),
                         ("system:public-info-viewer", [AUTHENTICATED, "system:unauthenticated"]))]


@dataclass(frozen=True)
class User:
    """user.Info: who the authenticator says sent the request."""

    name: str
    groups: tuple[str, ...]


def service_account(namespace: str, name: str) -> User:
    """serviceaccount.UserInfo, with the group every authenticated user has."""
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED))


@dataclass(frozen=True)
class Attributes:
    """authorizer.AttributesRecord, as request.RequestInfo fills it."""

    verb: str
    path: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    """"" for cluster-scoped objects and for requests across every namespace."""
    name: str = ""


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """The attributes the API server authorizes a request by (requestinfo.go NewRequestInfo):
    GET on a collection is list (watch with ?watch=true), on an object get; POST create, PUT
    update, PATCH patch (server-side apply included), DELETE delete (deletecollection without
    a name). Paths outside /api and /apis, and discovery (/api/v1, /apis/<group>/<version>),
    are non-resource requests whose verb is the method."""
    method = method.upper()
    parts = [p for p in path.strip("/").split("/") if p]
    non_resource = Attributes(verb=method.lower(), path=path, resource_request=False)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":  # GrouplessAPIPrefixes holds "api" only
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in SPECIAL_VERBS:
        verb, parts = parts[0], parts[1:]
    else:
        verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}.get(method, "")
    namespace = ""
    if parts[0] == "namespaces":
        if len(parts) > 1:
            namespace = parts[1]
            if len(parts) > 2 and parts[2] not in NAMESPACE_SUBRESOURCES:
                parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch") in ("true", "1") else "list"
        selected = _exact_name(query.get("fieldSelector", ""))
        name = selected or name
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb=verb, path=path, resource_request=True, api_group=group, api_version=version,
                      resource=resource, subresource=subresource, namespace=namespace, name=name)


def _exact_name(field_selector: str) -> str:
    """A list or watch of one object by `metadata.name=<name>` is authorized for that name."""
    for term in filter(None, field_selector.split(",")):
        key, _, value = term.partition("==") if "==" in term else term.partition("=")
        if key == "metadata.name":
            return value
    return ""


# ---- rbac.go and the rule helpers it calls (pkg/apis/rbac/v1/evaluation_helpers.go) -----------
def verb_matches(rule: dict, verb: str) -> bool:
    """VerbMatches."""
    return any(v in ("*", verb) for v in rule.get("verbs") or [])


def api_group_matches(rule: dict, group: str) -> bool:
    """APIGroupMatches."""
    return any(g in ("*", group) for g in rule.get("apiGroups") or [])


def resource_matches(rule: dict, combined: str, subresource: str) -> bool:
    """ResourceMatches: "*", the exact "resource" or "resource/subresource", or "*/subresource"."""
    for r in rule.get("resources") or []:
        if r in ("*", combined):
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def resource_name_matches(rule: dict, name: str) -> bool:
    """ResourceNameMatches: no resourceNames means every name."""
    names = rule.get("resourceNames") or []
    return not names or name in names


def non_resource_url_matches(rule: dict, path: str) -> bool:
    """NonResourceURLMatches: exact, "*", or a prefix ending in "*"."""
    for url in rule.get("nonResourceURLs") or []:
        if url in ("*", path) or (url.endswith("*") and path.startswith(url.rstrip("*"))):
            return True
    return False


def rule_allows(attributes: Attributes, rule: dict) -> bool:
    """RuleAllows."""
    a = attributes
    if a.resource_request:
        combined = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        return (verb_matches(rule, a.verb) and api_group_matches(rule, a.api_group)
                and resource_matches(rule, combined, a.subresource) and resource_name_matches(rule, a.name))
    return verb_matches(rule, a.verb) and non_resource_url_matches(rule, a.path)


def applies_to(user: User, subject: dict, namespace: str) -> bool:
    """appliesToUser (pkg/registry/rbac/validation/rule.go): a ServiceAccount subject without
    a namespace means the binding's own."""
    kind = subject.get("kind")
    if kind == "User":
        return user.name == subject.get("name")
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        sa_namespace = subject.get("namespace") or namespace
        return bool(sa_namespace) and user.name == f"system:serviceaccount:{sa_namespace}:{subject.get('name')}"
    return False


class Authorizer:
    """The RBAC authorizer over a fixed set of Roles, ClusterRoles and their bindings (plus
    the bootstrap discovery roles): a ClusterRoleBinding grants its ClusterRole everywhere, a
    RoleBinding its Role or ClusterRole in the binding's namespace only."""

    def __init__(self, objects: Iterable[dict]):
        objects = list(objects)
        self.cluster_roles = dict(BOOTSTRAP_CLUSTER_ROLES)
        self.roles: dict[tuple[str, str], list[dict]] = {}
        self.cluster_role_bindings: list[dict] = list(BOOTSTRAP_BINDINGS)
        self.role_bindings: list[dict] = []
        for obj in objects:
            meta = obj.get("metadata") or {}
            if obj.get("kind") == "ClusterRole":
                self.cluster_roles[meta["name"]] = list(obj.get("rules") or [])
            elif obj.get("kind") == "Role":
                self.roles[meta["namespace"], meta["name"]] = list(obj.get("rules") or [])
            elif obj.get("kind") == "ClusterRoleBinding":
                self.cluster_role_bindings.append(obj)
            elif obj.get("kind") == "RoleBinding":
                self.role_bindings.append(obj)

    def _role_rules(self, ref: dict, namespace: str) -> list[dict]:
        """GetRoleReferenceRules: a Role of the binding's namespace, or a ClusterRole (a missing
        role grants nothing)."""
        if ref.get("kind") == "ClusterRole":
            return self.cluster_roles.get(ref.get("name"), [])
        return self.roles.get((namespace, ref.get("name")), [])

    def rules_for(self, user: User, namespace: str) -> Iterator[dict]:
        """VisitRulesFor: ClusterRoleBindings first, then the RoleBindings of `namespace`
        (none for a cluster-scoped request or one across every namespace)."""
        for binding in self.cluster_role_bindings:
            if any(applies_to(user, s, "") for s in binding.get("subjects") or []):
                yield from self._role_rules(binding["roleRef"], "")
        if not namespace:
            return
        for binding in self.role_bindings:
            if binding["metadata"].get("namespace") != namespace:
                continue
            if any(applies_to(user, s, namespace) for s in binding.get("subjects") or []):
                yield from self._role_rules(binding["roleRef"], namespace)

    def allows(self, user: User, attributes: Attributes) -> bool:
        """RBACAuthorizer.Authorize: allowed when any rule visited allows it."""
        return any(rule_allows(attributes, rule) for rule in self.rules_for(user, attributes.namespace))


def forbidden(user: User, attributes: Attributes) -> dict:
    """The 403 Status the API server answers (responsewriters.Forbidden: forbiddenMessage
    inside apierrors.NewForbidden)."""
    a = attributes
    if not a.resource_request:
        reason = f"User {_q(user.name)} cannot {a.verb} path {_q(a.path)}"
    else:
        resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        where = f"in the namespace {_q(a.namespace)}" if a.namespace else "at the cluster scope"
        reason = f"User {_q(user.name)} cannot {a.verb} resource {_q(resource)} in API group {_q(a.api_group)} {where}"
    qualified = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
    if not a.resource_request or not qualified:
        message = f"forbidden: {reason}"
    elif a.name:
        message = f"{qualified} {_q(a.name)} is forbidden: {reason}"
    else:
        message = f"{qualified} is forbidden: {reason}"
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message,
            "reason": "Forbidden", "details": {"name": a.name, "group": a.api_group, "kind": a.resource},
            "code": 403}


def _q(text: str) -> str:
    """Go's %q for the plain strings these messages quote."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
