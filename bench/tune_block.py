import sys, os, math, torch
sys.path.insert(0, "python")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof
import stof_cli as sc
ctx = stof.Context()
def med(fn, reps=20):
    return sc.time_ms(fn, 3, reps)
import torch.nn.functional as F
import numpy as np
cases=[("bigbird",16,4096),("sliding_window",16,4096),("bigbird",8,1024),("bigbird",1,128)]
if len(sys.argv)>1:  # e.g. dense:16:4096,bigbird:8:512
    cases=[(c.split(":")[0],int(c.split(":")[1]),int(c.split(":")[2])) for c in sys.argv[1].split(",")]
for mname,B,S in cases:
    H,D=12,64
    mask=stof.Mask.dense(np.ones((S,S),dtype=np.uint8)) if mname=="dense" else stof.Mask.pattern(mname,q_len=S)
    nnz=int(mask.to_dense(0).sum())
    qkv=torch.empty(B,S,3*H*D,dtype=torch.float16,device="cuda").uniform_(-1,1)
    q,k,v=(qkv[...,i*H*D:(i+1)*H*D].view(B,S,H,D).transpose(1,2) for i in range(3))
    dense=torch.from_numpy(mask.to_dense(0)).bool().cuda()
    ref=F.scaled_dot_product_attention(q,k,v,attn_mask=dense).transpose(1,2).reshape(B,S,H*D)
    tf=med(lambda: F.scaled_dot_product_attention(q,k,v))
    print(f"{mname} B={B} S={S} density {nnz/S/S:.3f} flash-dense {tf:.3f} ms")
    for cfg in [dict(kernel="block",block_m=16,block_n=16,num_warps=1),dict(kernel="block",block_m=64,block_n=64,num_warps=4),dict(kernel="block",block_m=128,block_n=64,num_warps=4),dict(kernel="block",block_m=128,block_n=64,num_warps=8),dict(kernel="block",block_m=64,block_n=32,num_warps=4),dict(kernel="block",block_m=128,block_n=128,num_warps=8),dict(kernel="block",block_m=128,block_n=32,num_warps=8)]:
        try:
            at=ctx.attention(batch=B,heads=H,head_dim=D,q_len=S,mask=mask,**cfg)
        except stof.StofError as e:
            print("  ",cfg,"plan error",e); continue
        out=torch.full((B,S,H*D),float('nan'),dtype=torch.float16,device="cuda")
        at(qkv,out); torch.cuda.synchronize()
        err=((out.float()-ref.float()).norm()/ref.float().norm()).item()
        t=med(lambda: at(qkv,out))
        print(f"   {at.describe()[:60]:60s} {t:.3f} ms  {4*B*H*nnz*D/t/1e9:.1f} TFLOP/s err {err:.1e}")
