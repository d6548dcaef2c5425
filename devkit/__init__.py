"""What the tests and the bench both run on, outside the product (not in the wheel): `simulator`, a simulated
Wormhole built from ../shared/vendor's ttsim source (`python -m devkit.simulator build`, run by `make test`), and
`port_oracle`, an oracle of tt-metal's GR00T N1.6 port written from reading its files, which the tests check our
layout against and the bench runs as the port's own load path."""
