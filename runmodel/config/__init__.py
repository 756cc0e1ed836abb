"""Runs described as data: registries of named things (``registry``), runmodel's own
registrations (``builtins``) and ``RunConfig`` (``runconfig``). Nothing here runs a
model: a config run in its folder is ``runmodel.runs``, above the engine. The public names
are exported by ``runmodel``."""
