"""``import fairring`` registers the backend "fairring", as the module of that
name did for Meta's earlier research backend: Meta's PARAM comms benchmark
imports it for ``--backend fairring`` and does nothing else with it.  The
package is ``fairring_py``; this module only imports it."""

from fairring_py import BACKEND_NAME, Options, __version__, dump_recent  # noqa: F401
