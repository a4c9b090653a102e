# Sourced by the GPU scripts: the libraries a staged binary loads on the GPU machine.
# - scripts/stage_device.sh's packed libraries (Gloo, OpenBLAS, ...) under $M/lib;
# - the tokenizer cache it packed (GPT-2's and Llama 3's files), under $M/cache;
# - cuDNN, which Myriad loads at run time for its fused attention (train.attention): from the
#   system when ldconfig knows it, else from the Python wheel (nvidia-cudnn) PyTorch brings.
M=${M:-/tmp/m}
export LD_LIBRARY_PATH=$M/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
[ -d "$M/cache" ] && export MYRIAD_CACHE=$M/cache
if ! ldconfig -p 2>/dev/null | grep -q libcudnn_graph.so.9; then
  d=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null)/lib
  if [ -e "$d/libcudnn_graph.so.9" ]; then export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; fi
fi
