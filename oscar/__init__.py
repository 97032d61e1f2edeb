"""The OSCAR method: calibration statistics, covariance targets, rotation construction and the OSCAR quantizer."""
