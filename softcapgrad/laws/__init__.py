"""The documents' laws and the format arithmetic behind them: float formats and their switches
(formats), tanh's slope and knee (saturation), the attenuation identity and the ratchet (attenuation),
knees and horizons by formula and exact search (knee), and the correction's descent in exact and
table arithmetic (dynamics). numpy, ml_dtypes and mpmath only: torch is imported lazily, inside the
functions that compare a law with autograd. Imports only softcapgrad.core.
"""
