"""Every path from stored bytes to pixels, and the geometry they share.

``decode``    the rules and the exact (Pillow) path: the one place bytes become pixels
``fast``      the fast CPU path (simplejpeg, DCT-domain downscaling, torch's resize)
``jpeghead``  a JPEG's header parsed by libjpeg-turbo (size, subsampling) without decoding
``region``    random crops that decode only their box (nvImageCodec, CPU)
``gpu``       batches decoded and cropped on a CUDA device (nvImageCodec), the same geometry
``geometry``  torchvision's resize and crop boxes, and per-record crop plans
``pool``      the decode threads of one process
``buffers``   reused uint8 batch buffers
"""
