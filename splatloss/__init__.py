"""splatloss: exact, fast SSIM / MS-SSIM and photometric losses for Gaussian splatting."""
