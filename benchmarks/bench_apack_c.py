"""The register tile's k loop on cold weights, A read in place against A packed in the tile's order (gemm_c.APack): a
standalone C test of one thread, the 6 x 16 tile (two 8-float vectors, AVX2 and FMA), C += A B with B packed in panels
of 16 columns, every call on a fresh copy of A from a pool larger than L3 (as a net's weights arrive in a replay),
the variants interleaved call by call; median GFLOP/s of each. Modes: 0 A in place (rows k apart), 1 A packed, 2 A
packed with the next row block prefetched, 3 A in place with the next row block prefetched. Arguments per shape: M
N K, the k block and the panels per column chunk (plait's driver takes 2 on narrow products).

    .venv/bin/python benchmarks/bench_apack_c.py            # resnet50's 1x1 shapes and its 3x3 over 4608 channels
    .venv/bin/python benchmarks/bench_apack_c.py 510 48 4608 1152 3
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from plait.codegen import simd

SOURCE = r"""#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef float vf __attribute__((vector_size(32), aligned(4)));
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define MR 6
static inline __attribute__((always_inline)) void micro(int kc, const float* restrict a, long lda, long ldp, const float* restrict bp, float* restrict c, long ldc, int pf, const float* pfa) {
  vf acc[MR][2];
  for (int i=0;i<MR;i++) for(int v=0;v<2;v++) acc[i][v]=(vf){0};
  for (int p=0;p<kc;p++){
    if (pf && (p & 15) == 0) { for (int q=0;q<6;q++) __builtin_prefetch(pfa + p*MR + q*16, 0, 3); }
    vf b0=*(const vf*)(bp+p*16), b1=*(const vf*)(bp+p*16+8);
#pragma GCC unroll 6
    for(int i=0;i<MR;i++){ float s=a[i*lda+p*ldp]; acc[i][0]+=b0*s; acc[i][1]+=b1*s; }
  }
  for(int i=0;i<MR;i++){ *(vf*)(c+i*ldc) += acc[i][0]; *(vf*)(c+i*ldc+8) += acc[i][1]; }
}
static void run(int mode,int M,int N,int K,int kcb,int cpan,const float* Ab,const float* Bp,float* C){
  int panels=N/16;
  memset(C,0,(long)M*N*4);
  for(int j0=0;j0<panels;j0+=cpan){ int j1=j0+cpan<panels?j0+cpan:panels;
  for(int pc=0;pc<K;pc+=kcb){ int kc=K-pc<kcb?K-pc:kcb;
  for(int ii=0;ii<M;ii+=MR){
    if (mode==3) for(int i=0;i<MR;i++) for(int p=0;p<kc;p+=16) __builtin_prefetch(Ab+(long)(ii+MR+i)*K+pc+p,0,3);
    for(int jp=j0;jp<j1;jp++){
      const float* bp=Bp+(long)jp*K*16+(long)pc*16;
      if(mode==0||mode==3) micro(kc, Ab+(long)ii*K+pc, K, 1, bp, C+(long)ii*N+jp*16, N, 0, 0);
      else micro(kc, Ab+(long)ii*K+(long)pc*MR, 1, MR, bp, C+(long)ii*N+jp*16, N, mode==2 && jp==j0, Ab+(long)(ii+MR)*K+(long)pc*MR);
    }
  }}}
}
int main(int argc, char** argv){
  int M=atoi(argv[1]), N=atoi(argv[2]), K=atoi(argv[3]), kcb=atoi(argv[4]), cpan=atoi(argv[5]);
  int panels=N/16; long asz=(long)M*K; int copies = (int)((200L<<20)/(asz*4));
  float* A=aligned_alloc(64,asz*4*copies); for(long i=0;i<asz*copies;i++) A[i]=(i%7)*0.01f;
  float* Bp=aligned_alloc(64,(long)K*panels*16*4); for(long i=0;i<(long)K*panels*16;i++) Bp[i]=1;
  float* C=aligned_alloc(64,(long)M*N*4);
  enum{NM=4,R=60}; double ts[NM][R];
  for(int rep=0;rep<R;rep++) for(int m=0;m<NM;m++){
    const float* Ab=A+((rep*NM+m)%copies)*asz;
    double t=now(); run(m,M,N,K,kcb,cpan,Ab,Bp,C); ts[m][rep]=now()-t;
  }
  printf("M%d N%d K%d kc %d cpan %d:",M,N,K,kcb,cpan);
  for(int m=0;m<NM;m++){ double* t=ts[m]; for(int i=0;i<R;i++)for(int j=i+1;j<R;j++)if(t[j]<t[i]){double x=t[i];t[i]=t[j];t[j]=x;}
    printf("  m%d %.0f", m, 2.0*M*panels*16*K/t[R/2]/1e9); }
  printf(" GFLOP/s (median)\n");
}
"""

SHAPES = [
    "252 208 1024 4608 2",
    "510 48 2048 4608 2",
    "1020 208 256 4608 2",
    "2046 48 512 4608 2",
    "510 208 1024 4608 2",
    "510 48 4608 4608 2",
    "1020 192 512 4608 2",
]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        c, exe = Path(tmp) / "apack.c", Path(tmp) / "apack"
        c.write_text(SOURCE)
        subprocess.run([simd.c_compiler(), "-O2", "-march=native", str(c), "-o", str(exe)], check=True)
        for shape in [" ".join(sys.argv[1:])] if len(sys.argv) > 1 else SHAPES:
            cpu = "1" if (os.cpu_count() or 1) > 1 else "0"
            subprocess.run(["taskset", "-c", cpu, str(exe), *shape.split()], check=True)


if __name__ == "__main__":
    main()
