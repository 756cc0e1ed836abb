"""Runs described as data: registries of named things (``registry``), runmodel's own
registrations (``builtins``), ``RunConfig`` (``runconfig``) and the run directory each
config run lands in (``rundir``). The public names are exported by ``runmodel``."""
