"""The build pool: GPU slices for notebook servers, their lending to the train pool, and their
GPU-aware culling."""
