"""edgekit.targets: one plug-in module per runtime family.

``contract`` is what a target declares (its format, compute units, prediction priors,
KV-cache layout, device settings, availability check) and how it loads a model;
``registry`` finds the installed targets through the ``edgekit.targets`` entry-point
group; ``availability`` checks one against this host. Core code and services loop over
the registry and read capabilities: none names a target. A target module imports its
SDK only in ``load`` and ``check_host``, so targets are listed without any SDK.
"""
