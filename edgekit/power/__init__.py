"""Power meters: one small class a sensor, one interface, and a background sampler.

Every meter says where its figure comes from (``name``): a sensor (rapl, nvml, jetson-ina,
powermetrics, battery) or ``estimated`` (CPU utilisation x the device's power envelope).
"""
