"""Compatibility with other frameworks' models, files and defaults.

* :mod:`tnrec.compat.tensornet` -- TensorNet's constructors with TensorNet's
  defaults, each building the tnrec objects that reproduce its behaviour.
"""
