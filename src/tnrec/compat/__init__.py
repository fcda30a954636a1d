"""Compatibility with other frameworks' models, files and defaults.

* :mod:`tnrec.compat.tensornet` -- TensorNet's constructors with TensorNet's
  defaults, each building the tnrec objects that reproduce its behaviour.
* :mod:`tnrec.compat.tensornet_import` -- :func:`import_checkpoint` (``tnrec
  import-tensornet``): a TensorNet checkpoint's sparse tables as a tnrec
  checkpoint; :mod:`tnrec.compat.tensornet_files` reads its block files.
"""
