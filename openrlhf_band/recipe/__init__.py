"""The paper recipe: run scripts and results for reproducing BandPO with OpenRLHF."""
