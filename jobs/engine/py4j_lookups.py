"""Py4J's name lookups, made once per process instead of once per call.

PySpark's driver talks to the JVM through Py4J, and Py4J asks the JVM what every name is before it
uses it: ``sc._jvm.functions.col("x")`` is three round trips over the gateway's socket, one to find
the class ``functions``, one to learn that ``col`` is a method, and the call. Building the plans of
one analyze makes about 23,000 such lookups, a third of all its round trips, and a round trip costs
0.13 to 0.37 ms on this machine (docs/BENCHMARKS.md, "What is set": Py4J lookups remembered).

A class, a nested class or a static method keeps its identity for the life of the JVM, so the
answer can be remembered on the Python object that asked: the JVM view (per view, as its imports
decide what a short name means), a package (by full name) or a class. Nothing else is remembered:
a static field's value is read each time, a name that failed is asked again, and a view's answer
"package" (Py4J's answer for any name it does not know yet, which a later import may change) is
not kept either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from py4j import java_gateway

__all__ = ["install", "installed"]

_installed = False


def _remembering(original: Callable[[Any, str], Any], kinds: tuple[type, ...]) -> Callable[[Any, str], Any]:
    def __getattr__(self: Any, name: str) -> Any:
        remembered = vars(self).get("_amqpscope_names")
        if remembered is None:
            remembered = vars(self)["_amqpscope_names"] = {}
        found = remembered.get(name)
        if found is None:
            found = original(self, name)
            if type(found) in kinds:
                remembered[name] = found
        return found

    __getattr__.__wrapped__ = original  # type: ignore[attr-defined]
    return __getattr__


def install() -> None:
    """Remember Py4J's class and static-method lookups from now on (idempotent)."""
    global _installed
    if _installed:
        return
    class_or_method = (java_gateway.JavaClass, java_gateway.JavaMember)
    kinds = {
        java_gateway.JVMView: class_or_method,
        java_gateway.JavaPackage: (java_gateway.JavaClass, java_gateway.JavaPackage),
        java_gateway.JavaClass: class_or_method,
    }
    for cls, kept in kinds.items():
        cls.__getattr__ = _remembering(cls.__getattr__, kept)
    _installed = True


def installed() -> bool:
    """True once ``install`` has run in this process."""
    return _installed
