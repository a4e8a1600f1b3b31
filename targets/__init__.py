"""edgekit.targets: one module per device family's runtime.

``catalog`` describes every target as data (what it loads, the extra it needs, the SDK
modules it imports) so targets can be listed and checked without importing any SDK.
"""
