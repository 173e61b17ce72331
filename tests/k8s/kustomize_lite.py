"""A small kustomize renderer for the features k8s/ uses, for machines without kubectl (neither
Debian bookworm nor PyPI ships it). Where kubectl exists the manifest test renders with both and
requires the same objects, so this file is checked against the real thing.

Supported kustomization.yaml keys: resources (files and directories), patches (strategic merge,
from path: or patch:, matched by kind + name or by target:; JSON 6902 lists with a target:),
images (newName / newTag / digest), namespace (set on every namespaced object). Anything else
is an error, never silently ignored.

Strategic merge, as Kubernetes defines it for the fields used here: maps merge recursively; a
null value deletes the key; lists of containers / volumes / env / volumeMounts / ports merge
item by item on their merge key (items new to the list come first, as kustomize puts them),
other lists are replaced; a document with `$patch: delete`
removes the object.

    python3 tests/k8s/kustomize_lite.py k8s/overlays/gpu     # YAML on stdout, like kubectl kustomize
"""
import copy
import os
import sys

import yaml

SUPPORTED_KEYS = {"apiVersion", "kind", "namespace", "resources", "patches", "images"}

# Kinds without a namespace among those k8s/ could use: `namespace:` leaves them alone.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ClusterIssuer",
                  "PersistentVolume", "StorageClass", "PriorityClass", "CustomResourceDefinition"}

# field name -> merge key (Kubernetes' patchMergeKey), for lists of maps. "ports" depends on
# the type: container ports merge on containerPort, Service ports on port.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
}


class KustomizeError(Exception):
    pass


def _merge_key(field, items):
    if field == "ports":
        if any(isinstance(i, dict) and "containerPort" in i for i in items):
            return "containerPort"
        return "port"
    return MERGE_KEYS.get(field)


def _check_directives(patch, where):
    for k in patch:
        if isinstance(k, str) and k.startswith("$"):
            raise KustomizeError("%s: patch directive %s is not supported" % (where, k))


def smp_merge(orig, patch, where="patch"):
    """Strategic merge of patch into orig (both maps); returns a new map."""
    _check_directives(patch, where)
    out = copy.deepcopy(orig)
    for k, pv in patch.items():
        if pv is None:
            out.pop(k, None)
            continue
        ov = out.get(k)
        if isinstance(pv, dict) and isinstance(ov, dict):
            out[k] = smp_merge(ov, pv, where + "." + k)
        elif isinstance(pv, list) and isinstance(ov, list):
            mk = _merge_key(k, ov + pv)
            if mk and all(isinstance(i, dict) for i in ov + pv):
                merged, added = copy.deepcopy(ov), []
                for item in pv:
                    if mk not in item:
                        raise KustomizeError("%s.%s: list item without merge key %s" % (where, k, mk))
                    _check_directives(item, where + "." + k)
                    idx = [j for j, o in enumerate(merged) if o.get(mk) == item[mk]]
                    if idx:
                        merged[idx[0]] = smp_merge(merged[idx[0]], item, "%s.%s[%s]" % (where, k, item[mk]))
                    else:
                        added.append(_strip_nulls(copy.deepcopy(item)))
                out[k] = added + merged  # as kustomize does: new items first, in patch order
            else:
                out[k] = copy.deepcopy(pv)
        else:
            out[k] = _strip_nulls(copy.deepcopy(pv))
    return out


def _strip_nulls(v):
    if isinstance(v, dict):
        return {k: _strip_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_strip_nulls(x) for x in v]
    return v


def _pointer(path):
    if not path.startswith("/"):
        raise KustomizeError("JSON pointer '%s' must start with /" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json6902(obj, ops, where):
    out = copy.deepcopy(obj)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        parent = out
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if kind == "add":
            if isinstance(parent, list):
                if last == "-":
                    parent.append(copy.deepcopy(op["value"]))
                else:
                    parent.insert(int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(op["value"])
            else:
                if last not in parent:
                    raise KustomizeError("%s: replace of missing %s" % (where, op["path"]))
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise KustomizeError("%s: JSON 6902 op '%s' is not supported" % (where, kind))
    return out


def _group_version(api_version):
    return tuple(api_version.split("/", 1)) if "/" in api_version else ("", api_version)


def _matches(obj, target):
    group, version = _group_version(obj.get("apiVersion", ""))
    for k in target:
        if k not in ("group", "version", "kind", "name"):
            raise KustomizeError("patch target selector '%s' is not supported" % k)
    return (target.get("group", group) == group and target.get("version", version) == version
            and target.get("kind", obj.get("kind")) == obj.get("kind")
            and target.get("name", obj["metadata"].get("name")) == obj["metadata"].get("name"))


def _load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _find_kustomization(d):
    for n in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if os.path.isfile(os.path.join(d, n)):
            return os.path.join(d, n)
    raise KustomizeError("%s: no kustomization.yaml" % d)


def render(d):
    """Renders the kustomization in directory d: a list of objects (maps)."""
    kpath = _find_kustomization(d)
    with open(kpath) as f:
        k = yaml.safe_load(f) or {}
    extra = set(k) - SUPPORTED_KEYS
    if extra:
        raise KustomizeError("%s: unsupported keys %s" % (kpath, sorted(extra)))
    objs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(d, r))
        objs.extend(render(p) if os.path.isdir(p) else _load_docs(p))
    for i, pe in enumerate(k.get("patches", [])):
        where = "%s patches[%d]" % (kpath, i)
        if "path" in pe:
            docs = _load_docs(os.path.join(d, pe["path"]))
        else:
            docs = [d_ for d_ in yaml.safe_load_all(pe["patch"]) if d_ is not None]
        target = pe.get("target")
        if len(docs) == 1 and isinstance(docs[0], list):
            if not target:
                raise KustomizeError("%s: a JSON 6902 patch needs a target" % where)
            hits = [j for j, o in enumerate(objs) if _matches(o, target)]
            if not hits:
                raise KustomizeError("%s: no object matches %s" % (where, target))
            for j in hits:
                objs[j] = json6902(objs[j], docs[0], where)
            continue
        for doc in docs:
            sel = target or {"kind": doc.get("kind"), "name": doc.get("metadata", {}).get("name")}
            hits = [j for j, o in enumerate(objs) if _matches(o, sel)]
            if not hits:
                raise KustomizeError("%s: no object matches %s" % (where, sel))
            if doc.get("$patch") == "delete":
                objs = [o for j, o in enumerate(objs) if j not in hits]
                continue
            body = {kk: v for kk, v in doc.items() if kk not in ("apiVersion", "kind")}
            for j in hits:
                objs[j] = smp_merge(objs[j], body, where)
    for im in k.get("images", []):
        for o in objs:
            for c in _containers(o):
                name, _, _ = c.get("image", "").partition(":")
                if name == im["name"]:
                    c["image"] = im.get("newName", name) + (
                        "@" + im["digest"] if "digest" in im else ":" + str(im.get("newTag", "latest")))
    if "namespace" in k:
        for o in objs:
            if o.get("kind") not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = k["namespace"]
    ids = [(o.get("apiVersion"), o.get("kind"), o["metadata"].get("name")) for o in objs]
    if len(set(ids)) != len(ids):
        raise KustomizeError("%s: duplicate objects" % kpath)
    return objs


def _containers(o):
    spec = o.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: kustomize_lite.py DIR")
    yaml.safe_dump_all(render(sys.argv[1]), sys.stdout, sort_keys=True)
